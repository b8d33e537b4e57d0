"""Smoke test of the benchmark suite: ``python -m bench --quick --only floors,query`` runs
real daemons and writes its three result files. No figure is asserted: speed is measured
by the benchmark, never by the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_floors_and_query_write_their_results(tmp_path: Path) -> None:
    out = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "floors,query", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["suites"] == ["floors", "query"]
    assert set(results["query"]) == {"50", "2000"}
    assert results["query"]["2000"]["every row"]["hits"] == 2000
    assert results["query"]["2000"]["3 chars"]["hits"] == 20  # the 1% needle
    assert set(results["floors"]["scan"]) == {"50", "2000"}
    table = (out / "RESULTS.md").read_text()
    assert "## `memory/query` round trip" in table
    assert "## Floors" in table
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no plot" in proc.stdout
    else:
        assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unknown_suite_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--only", "nope"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown suite nope" in proc.stderr


def test_roundtrip_compares_a_base_checkout_with_this_tree(tmp_path: Path) -> None:
    """``python -m bench.roundtrip --base``: both builds measured, with the floors beside them."""
    out = tmp_path / "rt.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "bench.roundtrip", "--base", str(ROOT), "--rounds", "1", "--reps", "5",
                           "--sizes", "50", "--needles", "3 chars,no text", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert set(results["results"]) == {"before", "after"}
    assert set(results["results"]["after"]["50"]) == {"3 chars", "no text"}
    assert set(results["floors"]["50"]) == {"echo", "3 chars"}
    assert "| 50 | 3 chars |" in proc.stdout


def test_every_explained_miss_names_a_target_and_a_miss_is_listed_with_it() -> None:
    """bench/report.py's WHY_NOT keys are the starts of real target names (a renamed target
    cannot leave its explanation behind), and RESULTS.md lists each miss with its why."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench import report
    finally:
        sys.path.remove(str(ROOT))
    results = {"floors": {"sqlite_full_commits_per_s": 1000.0},
               "writes": {"auto/16": {"per_s": 2000.0}, "auto/1": {"per_s": 100.0}},
               "start": {"standalone": {"p50_us": 300_000.0}}, "peer": {"start": {"p50_us": 300_000.0}}}
    names = [what for what, _, _ in report.targets(results)]
    assert all(any(name.startswith(key) for name in names) for key in report.WHY_NOT)
    table = "\n".join(report.target_lines(results))
    one_client = next(n for n in names if n.startswith("acked writes, 1 client(s) ≥ 0.3×"))
    standalone = next(n for n in names if n.startswith("--standalone start"))
    assert f"- **{one_client}**: {report.WHY_NOT[one_client]}" in table
    assert f"- **{standalone}**: {report.WHY_NOT[standalone]}" in table
    sixteen = next(n for n in names if n.startswith("acked writes, 16 client(s) ≥ 0.9×"))
    assert f"| {sixteen} | 2.00× | yes |" in table and f"- **{sixteen}**" not in table


def test_mcp_rss_measures_a_real_daemon_with_ten_sessions(tmp_path: Path) -> None:
    """bench.mcp's RSS part on a real daemon and real ``memoryd mcp`` processes: the SDK is
    not mapped before the first MCP session, and 10 sessions are attached when measured.
    (The whole suite needs server-memory from npm: it runs in ``python -m bench``.)"""
    sys.path.insert(0, str(ROOT))
    try:
        from bench import mcp
        from bench.common import start_daemon
    finally:
        sys.path.remove(str(ROOT))
    d = start_daemon(tmp_path, "d", tmp_path / "m.db")
    try:
        out: dict[str, object] = {}
        mcp.rss(None, out, d)  # type: ignore[arg-type]
        s = mcp.Stdio(*mcp.memoryd_cmd(d))
        s.open()
        assert s.tools == 8
        assert s.tool("memory_add", {"track": "agent", "scope": "workspace", "text": "the bench wrote it"})["entry"]
        assert s.tool("memory_query", mcp.mcp_query_args("bench"))["total"] == 1
        s.close()
    finally:
        d.stop()
    r = out["rss"]
    assert isinstance(r, dict)
    assert r["sdk_mapped_idle"] is False and r["sdk_mapped_after"] is True
    assert r["sessions"] == 10 and r["connections"] == 11  # the sessions and the status call's own
    assert r["with_sessions_kb"] > r["idle_kb"] > 0


def test_the_mcp_targets_are_reported_and_a_miss_is_listed_with_why() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from bench import report
    finally:
        sys.path.remove(str(ROOT))
    ms = {"p50_us": 1000.0, "p99_us": 2000.0}
    results = {"mcp": {
        "peer_version": "1",
        "rss": {"idle_kb": 30_000, "sdk_mapped_idle": False, "first_session_s": 0.5, "after_first_session_kb": 80_000,
                "sessions": 10, "connections": 11, "with_sessions_kb": 90_000, "peak_kb": 90_000},
        "start": {"2000": {"raw": {"p50_us": 50_000.0, "p99_us": 51_000.0}, "sdk": ms,
                           "python_pass": {"p50_us": 10_000.0}, "first_session_s": 0.5, "tools": 8},
                  "peer": {"raw": {"p50_us": 200_000.0, "p99_us": 210_000.0}, "sdk": ms}},
        "query": {"entries": 2000, "limit": 20, "needles": {
            label: {"mcp": {**ms, "hits": 1}, "socket": ms, "peer": {"p50_us": 10_000.0, "hits": 1}}
            for label in ("1 char", "2 chars", "3 chars", "8 chars", "CJK", "every row", "no text")}},
        "writes": {"store_starts_at": 2000, "auto/1": {"per_s": 500.0, "daemon_cpu_us_per_write": 1.0},
                   "auto/16": {"per_s": 2000.0, "daemon_cpu_us_per_write": 1.0}, "peer": {"per_s": 100.0}}}}
    got = {what: (val, ok) for what, val, ok in report.targets(results) if "MCP" in what}
    spawn = next(w for w in got if w.startswith("MCP spawn → tools/list answered (memoryd mcp"))
    assert got[spawn] == ("5.00×", False)
    assert got["MCP memory_query at 2,000 ≥ 5× faster than server-memory's search_nodes (worst needle)"] == \
        ("10.00×", True)
    assert got["MCP memory_add, 1 session(s) ≥ 10× server-memory's create_entities"] == ("5.00×", False)
    assert got["daemon RSS with 10 MCP sessions ≤ 120 MB"] == ("87.9 MB", True)
    table = "\n".join(report.target_lines(results))
    assert f"- **{spawn}**: {report.why_not(spawn)}" in table
    md = report.markdown(results)
    assert "## MCP: `memoryd mcp` beside server-memory" in md
    assert "| `memoryd mcp`, 2,000-entry store, raw lines | 50.00 ms |" in md
