"""The ``mcp`` suite's part of RESULTS.md and results.png: its targets, its tables and
its panel (bench/report.py calls these)."""

from __future__ import annotations

from typing import Any

from .common import NEEDLES, START_BOUNDS
from .figures import _div, _get, _mb, _ms, _x

#: the daemon's RSS with this many MCP sessions attached is the target's
RSS_LIMIT_MB = 120


def targets(r: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The MCP front-end's targets, each (what, the measured value, met?)."""
    m = r.get("mcp") or {}
    out: list[tuple[str, str, bool | None]] = []

    def row(what: str, v: float | None, ok: bool | None, fmt: str = "{:.2f}×") -> None:
        out.append((what, "not measured" if v is None else fmt.format(v), None if v is None else ok))

    st = _get(m, "start", "2000") or {}
    raw = _get(st, "raw", "p50_us")
    v = _div(raw, _get(st, "python_pass", "p50_us"))
    bound = START_BOUNDS["mcp"]
    row(f"MCP spawn → tools/list answered (memoryd mcp, raw lines) ≤ {bound:g}× python -c pass", v,
        v is not None and v <= bound)
    v = _div(raw, _get(m, "start", "peer", "raw", "p50_us"))
    row("MCP spawn → tools/list answered ≤ 0.25× server-memory's", v, v is not None and v <= 0.25)
    q = _get(m, "query", "needles") or {}
    speed = [_div(_get(q, t, "peer", "p50_us"), _get(q, t, "mcp", "p50_us")) for t in NEEDLES]
    v = None if not q or None in speed else min(s for s in speed if s is not None)
    row("MCP memory_query at 2,000 ≥ 5× faster than server-memory's search_nodes (worst needle)", v,
        v is not None and v >= 5.0)
    peer_w = _get(m, "writes", "peer", "per_s")
    for sessions in ("1", "16"):
        v = _div(_get(m, "writes", f"auto/{sessions}", "per_s"), peer_w)
        row(f"MCP memory_add, {sessions} session(s) ≥ 10× server-memory's create_entities", v,
            v is not None and v >= 10.0)
    rss = m.get("rss") or {}
    kb = _get(rss, "with_sessions_kb")
    row(f"daemon RSS with {rss.get('sessions', 10)} MCP sessions ≤ {RSS_LIMIT_MB} MB",
        None if kb is None else kb / 1024, kb is not None and kb <= RSS_LIMIT_MB * 1024, "{:.1f} MB")
    idle = _get(rss, "idle_kb")
    mapped = _get(rss, "sdk_mapped_idle")
    out.append(("daemon idle without MCP sessions: the MCP SDK not loaded",
                "not measured" if idle is None else
                f"{idle / 1024:.1f} MB, SDK {'loaded' if mapped else 'not loaded'}",
                None if idle is None else not mapped))
    return out


def markdown(r: dict[str, Any]) -> list[str]:
    m = r.get("mcp")
    if not m:
        return []
    peer_line = (f"server-memory {m['peer_version']}." if "peer_version" in m
                 else f"server-memory was not measured: {m.get('peer_skipped')}.")
    lines = ["## MCP: `memoryd mcp` beside server-memory", "",
             f"Both servers driven with raw NDJSON lines over the child's pipes (msgspec, in the measuring process): "
             f"the figures are the servers'. {peer_line} `memoryd mcp` relays into a "
             "running daemon on policy auto that has already served an MCP session, so the SDK import (once per "
             "daemon, on its first MCP session) is paid before the timed runs; it is shown apart.", ""]
    st = m.get("start") or {}
    peer = _get(st, "peer", "raw", "p50_us")
    if st:
        lines += ["### Spawn → `tools/list` answered", "",
                  "Spawn, `initialize` (the 2025-11-25 handshake), `notifications/initialized` and `tools/list` "
                  "written at once, until `tools/list` is answered; beside `python -c pass` measured alternately "
                  "with it. The SDK rows time the official SDK's `mcp.Client(..., mode=\"legacy\")`: entering it "
                  "and `list_tools()` (the host's view, the client's own cost included). Each session's "
                  "`initialize` takes its frozen snapshot of every visible entry (the instructions).", "",
                  "| what | p50 | p99 | python -c pass | × python | × server-memory (raw) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for n in (k for k in st if k != "peer"):
            s = st[n]
            py = _get(s, "python_pass", "p50_us")
            for how, key in (("raw lines", "raw"), ("SDK client", "sdk")):
                v = s[key]
                lines.append(f"| `memoryd mcp`, {int(n):,}-entry store, {how} | {_ms(v['p50_us'])} | "
                             f"{_ms(v['p99_us'])} | {_ms(py)} | {_x(_div(v['p50_us'], py))} | "
                             f"{_x(_div(v['p50_us'], peer))} |")
        for how, key in (("raw lines", "raw"), ("SDK client", "sdk")):
            v = _get(st, "peer", key)
            if v:
                lines.append(f"| server-memory (node), empty file, {how} | {_ms(v['p50_us'])} | {_ms(v['p99_us'])} "
                             f"| | | {_x(_div(v['p50_us'], peer))} |")
        for n in (k for k in st if k != "peer"):
            lines.append(f"| a daemon's first MCP session ({int(n):,} entries; the SDK import), raw lines | "
                         f"{st[n]['first_session_s'] * 1000:.0f} ms | | | | |")
        lines.append("")
    q = _get(m, "query", "needles")
    if q:
        lines += [f"### `memory_query` at {m['query']['entries']:,} entries", "",
                  "One MCP session, `tools/call` round trips, limit 20, alternating with `memory/query` over the "
                  "socket (the same daemon) and server-memory's `search_nodes` on a graph of the same facts (it "
                  "returns every hit).", "",
                  "| needle | hits | MCP p50 | MCP p99 | socket p50 | MCP − socket | server-memory p50 | "
                  "server-memory ÷ MCP |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for label, v in q.items():
            needle = NEEDLES.get(label)
            shown = label if needle is None else f"{label} `{needle}`"
            mc, so, pe = v["mcp"], v["socket"], _get(v, "peer", "p50_us")
            lines.append(f"| {shown} | {mc['hits']:,} | {_ms(mc['p50_us'])} | {_ms(mc['p99_us'])} | "
                         f"{_ms(so['p50_us'])} | +{_ms(mc['p50_us'] - so['p50_us'])} | "
                         f"{'–' if pe is None else _ms(pe)} | {_x(_div(pe, mc['p50_us']))} |")
        lines.append("")
    w = m.get("writes")
    if w:
        pw = _get(w, "peer", "per_s")
        lines += ["### Acked `memory_add` throughput", "",
                  f"Policy auto; each daemon's store starts with {w['store_starts_at']:,} entries. Each `memoryd mcp` "
                  "process issues its adds in sequence; the sessions run at once. Beside it, `memory/add` over the "
                  "socket from as many clients, on the same daemon just after. server-memory: "
                  f"{pw if pw is not None else '–'} `create_entities`/s (one stdio client, sequential, from a "
                  f"{w['store_starts_at']:,}-entity graph).", "",
                  "| sessions | MCP adds/s | × server-memory | socket adds/s | MCP ÷ socket | daemon CPU per MCP add |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for key, v in w.items():
            if not key.startswith("auto/"):
                continue
            n = key.split("/")[1]
            so = _get(w, f"socket/{n}", "per_s")
            lines.append(f"| {n} | {v['per_s']:.0f} | {_x(_div(v['per_s'], pw))} | "
                         f"{'–' if so is None else f'{so:.0f}'} | {_x(_div(v['per_s'], so))} | "
                         f"{v['daemon_cpu_us_per_write']:.0f} µs |")
        lines.append("")
    rs = m.get("rss")
    if rs:
        lines += ["### Daemon memory with MCP sessions", "", "| what | RSS |", "| --- | --- |",
                  f"| daemon idle, 2,000-entry store, no MCP session yet (SDK "
                  f"{'loaded' if rs['sdk_mapped_idle'] else 'not loaded'}) | {_mb(rs['idle_kb'])} |",
                  f"| after its first MCP session (the SDK imported) | {_mb(rs['after_first_session_kb'])} |",
                  f"| with {rs['sessions']} `memoryd mcp` sessions attached, each initialized and having listed "
                  f"the tools | {_mb(rs['with_sessions_kb'])} |",
                  f"| peak (VmHWM) | {_mb(rs['peak_kb'])} |", ""]
    return lines


def plot(r: dict[str, Any], a: Any, b: Any, c: Any) -> None:
    """The MCP figures into the throughput (``a``) and query (``b``) panels, and the
    start panel ``c``."""
    m = r.get("mcp") or {}
    w = m.get("writes") or {}
    pts = sorted((int(k.split("/")[1]), v["per_s"]) for k, v in w.items() if k.startswith("auto/"))
    if pts:
        a.plot([s for s, _ in pts], [v for _, v in pts], "D-.", label="memoryd mcp: memory_add (MCP sessions)")
    pw = _get(w, "peer", "per_s")
    if pw:
        a.plot([1], [pw], "+", markersize=12, color="darkred", label="server-memory create_entities (mcp suite)")
    q = _get(m, "query", "needles") or {}
    n = _get(m, "query", "entries")
    if q and n:
        import matplotlib.pyplot as plt

        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, label in enumerate(NEEDLES):
            if label in q:
                b.plot([n], [q[label]["mcp"]["p50_us"] / 1000], "D", color=colors[i % len(colors)], fillstyle="none",
                       label="memoryd mcp memory_query" if i == 0 else None)
    st = m.get("start") or {}
    bars: list[tuple[str, float, float | None]] = []
    for k in (k for k in st if k != "peer"):
        bars.append((f"memoryd mcp\n{int(k):,} entries", st[k]["raw"]["p50_us"], _get(st[k], "sdk", "p50_us")))
    if _get(st, "peer", "raw"):
        bars.append(("server-memory", st["peer"]["raw"]["p50_us"], _get(st, "peer", "sdk", "p50_us")))
    py = _get(st, "2000", "python_pass", "p50_us")
    if py:
        bars.insert(0, ("python -c pass", py, None))
    if not bars:
        c.set_visible(False)
        return
    xs = range(len(bars))
    c.bar([x - 0.2 for x in xs], [v / 1000 for _, v, _ in bars], 0.4, label="raw NDJSON lines")
    c.bar([x + 0.2 for x in xs], [(s or 0) / 1000 for _, _, s in bars], 0.4, label="the SDK's mcp.Client")
    if py:
        bound = START_BOUNDS["mcp"]
        c.axhline(bound * py / 1000, color="grey", linestyle=":", label=f"target: {bound:g}× python -c pass")
    c.set_xticks(list(xs), [name for name, _, _ in bars], fontsize=8)
    c.set_ylabel("p50, ms")
    c.set_title("MCP spawn → tools/list answered")
    c.legend(fontsize=8)
