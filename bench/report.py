"""results → RESULTS.md (medians and ratios), results.json, and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .common import NEEDLES, START_BOUNDS
from .figures import _div, _get, _mb, _ms, _ms_or, _x
from .mcp_report import markdown as mcp_markdown
from .mcp_report import plot as mcp_plot
from .mcp_report import targets as mcp_targets

#: Why a target that a run does not meet is missed: what the profiles and the in-process
#: measurements (bench/results/*.md) show, by the start of the target's name. RESULTS.md
#: lists those of the run's misses that have one.
WHY_NOT: dict[str, str] = {
    "acked writes, 16 client(s) ≥ 0.9× the FULL commit floor": (
        "Group commit pays only while writes queue behind a COMMIT in flight. The event loop's CPU per "
        "write (parse, gate, reply) and the writer thread's (the batch's SQL and COMMIT) share one "
        "interpreter, so together they bound the rate; on a busy 2-core machine the clients' own CPU "
        "competes with them. Since each batch runs whole on the writer's thread, its Python work and "
        "the loop's take turns at the GIL at every SQLite call; alternating builds put that step's "
        "cost at about a tenth of the 16-client rate, and the anyio transport's at about as much "
        "again before a connection's descriptor stayed registered across waits (bench/results/"
        "SIMPLICITY-2.md, \"The whole issue\" and \"Where the 16-client rate went\")."),
    "acked writes, 1 client(s) ≥ 0.3× the FULL commit floor": (
        "One sequential client pays each write's whole path alone, with nothing to share a commit with: "
        "the transaction itself (entry, its text index rows, audit row and chained ledger row, about "
        "18 WAL pages against the floor's 2) is about half the floor's rate in process, before any RPC "
        "(\"What one write commits\" below), and the request's Python path adds about 0.4 ms of CPU. "
        "The text index written in the write's own transaction doubled the entry's pages (5.9 to 12.6), "
        "where it was written after the acknowledgement before. Meeting it needs that path near "
        "halved, or fewer pages per write."),
    "query at 2,000 ≤ 1.0× the in-process instr scan": (
        "Each query waits for a commit of its own recalls (synchronous=NORMAL, shared only with the "
        "queries in flight beside it) and crosses two threads, a reader's and the writer's; a "
        "sequential client shares nothing. The recall transaction is about 150 µs of CPU since its "
        "savepoint journal stays in memory (it spilled to a temporary file, created and deleted per "
        "query, before); each such commit empties the readers' page caches, so the next read costs "
        "more than its SQL alone; and the two hops are four wake-ups of a sleeping thread, each of "
        "which waits for a core on a loaded 2-core machine. The worst needle is at the line, 0.94-1.13× "
        "over the third stop's runs (bench/results/SIMPLICITY-2.md, step 3 and the third stop)."),
    "query at 2,000 ≥ 3× faster than server-memory": (
        "What keeps the query at 2,000 over the instr scan keeps it here: each query waits for a "
        "commit of its own recalls and crosses a reader's thread and the writer's "
        "(bench/results/SIMPLICITY-2.md, step 3)."),
    "memoryctl query ≤ 5× python -c pass": (
        "Importing the stack memoryctl's async client runs on (anyio's asyncio backend and msgspec), "
        "no memoryd code yet, takes about 8× python -c pass by itself (python -m bench.startup prints "
        "it); only a start without asyncio and msgspec, a second, blocking client, could be within "
        "5× (bench/results/SIMPLICITY-2.md, step 1)."),
    "memoryctl status ≤ 5× python -c pass": (
        "As memoryctl query: the client's stack alone imports in about 8× python -c pass "
        "(bench/results/SIMPLICITY-2.md, step 1)."),
    "query at 2,000: p99 ≤ 3× p50": (
        "The slowest queries are those whose recall commit runs the WAL's automatic checkpoint: a "
        "20-entry page's recalls write 12-21 pages, so one sequential query in 50-80 checkpoints "
        "1,000 pages, which fsyncs twice even under synchronous=NORMAL; and those the machine's other load "
        "holds up: the same run's tail at 50 entries, where neither the text index nor a large page "
        "plays a part, shows how much of it is the machine's (bench/results/SIMPLICITY-2.md, step 3)."),
    "query at 100,000": (
        "The worst needle has thousands of hits (postgres: 7,667): the index plan's page reads and "
        "sorts every hit's rank keys, where a walk of the rank index would stop at the page's end, "
        "and the query waits for its recall commit (bench/results/SIMPLICITY-2.md, step 3)."),
    "acked writes, 1 client(s) ≥ 4× server-memory": (
        "One sequential client waits for one synchronous=FULL commit per write, and server-memory "
        "does not fsync at all: on a disk whose FULL commit floor is low (416 commits/s in the run of "
        "2026-12-01 23:22, 1,934 in the run before it) the client is at the floor (0.93× in that run) "
        "and the ratio is the disk's, not the daemon's."),
    "MCP spawn → tools/list answered (memoryd mcp, raw lines)": (
        "The relay process alone (serve --stdio, spawn → initialize) takes most of the budget. On the "
        "daemon's side a session costs, measured over a direct socket: attach 0.2 ms, initialize 1.5 ms "
        "at 50 entries (0.8 ms of it the frozen snapshot's synchronous=FULL commit with its audit row) "
        "and 8 ms at 2,000 (every visible entry rendered into a 114 KB snapshot, stored, hashed into "
        "the ledger and sent as the instructions), tools/list 0.8 ms (the SDK's dispatch); the snapshot "
        "is the protocol's and is never deferred past its commit (bench/results/MCP.md)."),
    "MCP memory_query at 2,000 ≥ 5× faster than server-memory's search_nodes": (
        "server-memory answers the selective needles in 2.3-2.7 ms, so 5× means a round trip under "
        "0.5 ms. An MCP memory_query is the session's query: its visibility filter and its audited "
        "recall (a 'recalled' ledger row and recall counters, which the next read waits for), which "
        "the socket column's plain query does not do; over the socket the same session query takes "
        "about 0.66 ms against 0.55 ms for the plain one. The SDK then adds about 0.15 ms per call "
        "(its dispatch: a task, middleware, pydantic validation and dumps) and about 0.15 ms more for "
        "a 20-entry result. server-memory records no recall (bench/results/MCP.md)."),
    "MCP memory_add, 1 session(s) ≥ 10× server-memory's create_entities": (
        "A sequential session waits for one synchronous=FULL commit per acknowledged add, and "
        "server-memory does not fsync: 10× is above what the same run's socket client reaches at one "
        "client (its socket adds/s column: 7.6-8.2× server-memory in the runs of 2026-12-01), before "
        "the SDK's per-call cost and the relay's hops (bench/results/MCP.md)."),
    "MCP memory_add, 16 session(s) ≥ 10× server-memory's create_entities": (
        "With 16 sessions the commits are shared, so the event loop's CPU per add bounds the rate: "
        "about 455-510 µs per MCP add against about 165 µs per socket add, the difference the SDK's "
        "dispatch and pydantic, on a 2-core machine where the 16 relays and the measuring process "
        "compete for the same cores (bench/results/MCP.md)."),
    "--standalone start ≤ 0.75× server-memory's start": (
        "A standalone start is Python imports for most of its time: asyncio (which imports ssl and "
        "concurrent.futures), sqlite3, msgspec, anyio and the daemon's own modules; opening a new "
        "store takes about 10 ms of it. The relay start, which a harness uses once a daemon runs, "
        "meets its own target."),
}


def why_not(what: str) -> str | None:
    return next((why for start, why in WHY_NOT.items() if what.startswith(start)), None)


def targets(r: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issue 10's targets, each (what, the measured ratio, met?); None when not measured."""
    out: list[tuple[str, str, bool | None]] = []
    floor = _get(r, "floors", "sqlite_full_commits_per_s")
    peer_w = _get(r, "peer", "writes", "per_s")

    def ratio_target(what: str, v: float | None, ok: bool | None, fmt: str = "{:.2f}×") -> None:
        out.append((what, "not measured" if v is None else fmt.format(v), None if v is None else ok))

    for clients, need_floor, need_peer in (("16", 0.9, 10.0), ("1", 0.3, 4.0)):
        w = _get(r, "writes", f"auto/{clients}", "per_s")
        # the median of the blocks' ratios, each against the floor taken beside it
        v = _get(r, "writes", f"auto/{clients}", "x_floor") or _div(w, floor)
        ratio_target(f"acked writes, {clients} client(s) ≥ {need_floor}× the FULL commit floor", v,
                     v is not None and v >= need_floor)
        v = _div(w, peer_w)
        ratio_target(f"acked writes, {clients} client(s) ≥ {need_peer:g}× server-memory", v,
                     v is not None and v >= need_peer)
    q2k = _get(r, "query", "2000") or {}
    instr = _get(r, "floors", "scan_instr", "2000") or {}
    peer_q = _get(r, "peer", "query", "2000") or {}
    texts = [label for label, needle in NEEDLES.items() if needle is not None]
    worst = [_div(_get(q2k, t, "p50_us"), _get(instr, t, "p50_us")) for t in texts]
    v = None if not q2k or not instr or None in worst else max(w for w in worst if w is not None)
    ratio_target("query at 2,000 ≤ 1.0× the in-process instr scan (worst needle)", v, v is not None and v <= 1.0)
    speed = [_div(_get(peer_q, t, "p50_us"), _get(q2k, t, "p50_us")) for t in NEEDLES]
    v = None if not q2k or not peer_q or None in speed else min(s for s in speed if s is not None)
    ratio_target("query at 2,000 ≥ 3× faster than server-memory (worst needle)", v, v is not None and v >= 3.0)
    tails = [_div(_get(q2k, t, "p99_us"), _get(q2k, t, "p50_us")) for t in NEEDLES]
    v = None if not q2k or None in tails else max(t for t in tails if t is not None)
    ratio_target("query at 2,000: p99 ≤ 3× p50 (worst needle)", v, v is not None and v <= 3.0)
    big = max((int(k) for k in (_get(r, "query") or {})), default=0)
    if big >= 100_000:
        qb = r["query"][str(big)]
        scan = _get(r, "floors", "scan", str(big)) or {}
        long_ = [label for label, needle in NEEDLES.items() if needle is not None and len(needle) >= 3]
        rs = [_div(_get(qb, t, "p50_us"), _get(scan, t, "p50_us")) for t in long_]
        v = None if not scan or None in rs else max(x for x in rs if x is not None)
        ratio_target(f"query at {big:,}, needles of 3+ chars: p50 ≤ 0.3× the in-process scan (worst)", v,
                     v is not None and v <= 0.3)
        small = min(int(k) for k in r["query"])
        v = _div(_get(qb, "no text", "p50_us"), _get(r, "query", str(small), "no text", "p50_us"))
        ratio_target(f"query without text at {big:,} ≤ 2× its cost at {small} (cost follows the page)", v,
                     v is not None and v <= 2.0)
    else:
        out.append(("query at 100,000 (3+ chars ≤ 0.3× scan; no text follows the page)", "not measured", None))
    st = r.get("start") or {}
    v = _div(_get(st, "relay", "p50_us"), _get(st, "relay_python_pass", "p50_us"))
    bound = START_BOUNDS["relay"]
    ratio_target(f"stdio spawn → initialize through the relay ≤ {bound:g}× python -c pass", v,
                 v is not None and v <= bound)
    cli = r.get("cli") or {}
    for verb in ("query", "status"):
        v = _div(_get(cli, verb, "p50_us"), _get(cli, f"{verb}_python_pass", "p50_us"))
        bound = START_BOUNDS[f"memoryctl {verb}"]
        ratio_target(f"memoryctl {verb} ≤ {bound:g}× python -c pass", v, v is not None and v <= bound)
    v = _div(_get(st, "standalone", "p50_us"), _get(r, "peer", "start", "p50_us"))
    ratio_target("--standalone start ≤ 0.75× server-memory's start", v, v is not None and v <= 0.75)
    rs_ = r.get("rss") or {}
    idle = _get(rs_, "idle_kb")
    ratio_target("idle RSS ≤ 40 MB", None if idle is None else idle / 1024, idle is not None and idle <= 40 * 1024,
                 "{:.1f} MB")
    busy = _get(rs_, "with_idle_conns_kb")
    n = _get(rs_, "idle_conns")
    ratio_target(f"RSS with {n or 1000} idle connections ≤ 120 MB", None if busy is None else busy / 1024,
                 busy is not None and busy <= 120 * 1024, "{:.1f} MB")
    empty = _get(st, "ready_empty", "p50_us")
    full = _get(st, "ready_big", "p50_us")
    v = None if empty is None or full is None else (full - empty) / 1000
    ratio_target(f"daemon start on a {_get(st, 'ready_big_entries') or 100_000:,}-entry store ≤ 100 ms beyond an empty "
                 "one", v, v is not None and v <= 100, "+{:.0f} ms")
    return out + mcp_targets(r)


def target_lines(r: dict[str, Any]) -> list[str]:
    """The targets' table, then each target this run missed with why (``WHY_NOT``)."""
    lines = ["## Targets (issue 10, and the MCP front-end's)", "", "| target | measured | met |", "| --- | --- | --- |"]
    missed = []
    for what, val, ok in targets(r):
        lines.append(f"| {what} | {val} | {'–' if ok is None else ('yes' if ok else '**no**')} |")
        if ok is False:
            missed.append(what)
    lines.append("")
    if missed:
        lines += ["Not met in this run, and why:", ""]
        lines += [f"- **{what}**: {why_not(what) or 'no explanation recorded (bench/report.py, WHY_NOT)'}"
                  for what in missed]
        lines.append("")
    return lines


def markdown(r: dict[str, Any]) -> str:
    env = r.get("env", {})
    lines = ["# memoryd benchmark results", "",
             f"`python -m bench{' --quick' if r.get('quick') else ''}` on {env.get('date_utc', '?')}: "
             f"Python {env.get('python')}, SQLite {env.get('sqlite')}, {env.get('cores')} cores, load average "
             f"{env.get('loadavg_at_start')} at start. Medians (p50) unless named; every ratio is to a figure "
             "measured in the same run.", ""]
    floors = r.get("floors") or {}
    peer = r.get("peer") or {}
    if "skipped" in peer:
        lines += [f"The peer was skipped: {peer['skipped']}.", ""]
    elif peer:
        lines += [f"Peer: {peer.get('package')} {peer.get('version')} on node {peer.get('node')}.", ""]

    lines += target_lines(r)

    w = r.get("writes")
    fl = floors.get("sqlite_full_commits_per_s")
    if w:
        pw = _get(peer, "writes", "per_s")
        wb = r.get("writes_before") or {}
        lines += ["## Acked `memory/add` throughput", "",
                  f"Each daemon's store starts with {w.get('store_starts_at'):,} entries. Floor: raw sqlite3, one "
                  "INSERT per `synchronous=FULL` WAL transaction, taken in each block beside the block's writes; "
                  "× floor is the median of the blocks' ratios, with their spread. server-memory: "
                  f"{pw if pw is not None else '–'} writes/s (one stdio client, sequential)."
                  + (" Before: the `--base` build, in the same blocks." if wb else ""), "",
                  "| policy | clients | writes/s | floor commits/s | × floor (spread) | × server-memory | "
                  "daemon CPU per write | before writes/s | before × floor |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for key, v in w.items():
            if not isinstance(v, dict):
                continue
            policy, clients = key.split("/")
            vf = v.get("floor_per_s", fl)
            x = v.get("x_floor", _div(v["per_s"], fl))
            lo, hi = v.get("x_floor_spread", (x, x))
            b = wb.get(key) or {}
            lines.append(f"| {policy} | {clients} | {v['per_s']:.0f} | {'–' if vf is None else f'{vf:.0f}'} | "
                         f"{_x(x)} ({_x(lo)}–{_x(hi)}) | {_x(_div(v['per_s'], pw))} | "
                         f"{v['daemon_cpu_us_per_write']:.0f} µs | {b.get('per_s', '–')} | {_x(b.get('x_floor'))} |")
        lines.append("")

    q = r.get("query")
    if q:
        lines += ["## `memory/query` round trip", "",
                  "limit 20. Floors: the in-process scan with store.py's scan-plan SQL (`LIKE … ESCAPE`, every hit "
                  "fetched, no conversion) and the older `instr(lower())` form; server-memory's `search_nodes` "
                  "returns every hit.", "",
                  "| entries | needle | hits | p50 | p99 | scan floor | × scan | × instr scan | server-memory p50 | "
                  "server-memory ÷ memoryd | before p50 | before p99 |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for n, row in q.items():
            for label, s in row.items():
                needle = NEEDLES.get(label)
                scan = _get(floors, "scan", n, label, "p50_us")
                instr = _get(floors, "scan_instr", n, label, "p50_us")
                pq = _get(peer, "query", n, label, "p50_us")
                shown = label if needle is None else f"{label} `{needle}`"
                lines.append(f"| {int(n):,} | {shown} | {s['hits']:,} | {_ms(s['p50_us'])} | {_ms(s['p99_us'])} | "
                             f"{'–' if scan is None else _ms(scan)} | {_x(_div(s['p50_us'], scan))} | "
                             f"{_x(_div(s['p50_us'], instr))} | {'–' if pq is None else _ms(pq)} | "
                             f"{_x(_div(pq, s['p50_us']))} | {_ms_or(_get(r, 'query_before', n, label, 'p50_us'))} | "
                             f"{_ms_or(_get(r, 'query_before', n, label, 'p99_us'))} |")
        lines.append("")

    st, cli = r.get("start"), r.get("cli")
    if st or cli or peer.get("start"):
        ps = _get(peer, "start", "p50_us")
        lines += ["## Starts and the CLI", "", "Spawn → `initialize` answered (stdio); a `memoryctl` run to its exit. "
                  "Each is beside `python -c pass` measured alternately with it.", "",
                  "| what | p50 | python -c pass | × python | × server-memory start |",
                  "| --- | --- | --- | --- | --- |"]
        rows: list[tuple[str, Any, Any]] = []
        if st:
            rows += [("`memoryd serve --stdio` (relay to a running daemon)", st.get("relay"),
                      st.get("relay_python_pass")),
                     ("`memoryd serve --stdio --standalone`", st.get("standalone"), st.get("standalone_python_pass"))]
        if cli:
            rows += [("`memoryctl query`", cli.get("query"), cli.get("query_python_pass")),
                     ("`memoryctl status`", cli.get("status"), cli.get("status_python_pass"))]
        if peer.get("start"):
            rows.append(("server-memory (node)", peer["start"], peer.get("start_python_pass")))
        for what, s, py in rows:
            if s is None:
                continue
            lines.append(f"| {what} | {_ms(s['p50_us'])} | {_ms(py['p50_us'])} | {_x(_div(s['p50_us'], py['p50_us']))} "
                         f"| {_x(_div(s['p50_us'], ps))} |")
        if st and "ready_empty" in st:
            lines.append(f"| daemon spawn → READY=1, empty store | {_ms(st['ready_empty']['p50_us'])} | | | |")
            lines.append(f"| daemon spawn → READY=1, {st['ready_big_entries']:,} entries | "
                         f"{_ms(st['ready_big']['p50_us'])} | | | |")
        lines.append("")

    rs = r.get("rss")
    if rs or peer.get("peak_rss_kb"):
        lines += ["## Memory", "", "| what | RSS |", "| --- | --- |"]
        if rs:
            lines += [f"| memoryd idle (2,000-entry store) | {_mb(rs['idle_kb'])} |",
                      f"| memoryd after one query | {_mb(rs['after_first_query_kb'])} |",
                      f"| memoryd with {rs['idle_conns']:,} idle initialized connections | "
                      f"{_mb(rs['with_idle_conns_kb'])} |",
                      f"| memoryd peak (VmHWM) | {_mb(rs['peak_kb'])} |"]
        if peer.get("peak_rss_kb"):
            lines.append(f"| server-memory peak (VmHWM, over its runs) | {_mb(peer['peak_rss_kb'])} |")
        lines.append("")

    lines += mcp_markdown(r)

    if floors:
        lines += ["## Floors", "", "| floor | value |", "| --- | --- |"]
        if fl is not None:
            pages = floors.get("sqlite_full_wal_pages_per_commit")
            lines.append(f"| sqlite3 one-row `synchronous=FULL` WAL transactions | {fl:.0f} commits/s"
                         + ("" if pages is None else f", {pages:.1f} WAL pages per commit") + " |")
        if "echo" in floors:
            lines.append(f"| Unix-socket echo round trip (Python echo process) | {_ms(floors['echo']['p50_us'])} |")
        if "python_pass" in floors:
            lines.append(f"| `python -c pass` | {_ms(floors['python_pass']['p50_us'])} |")
        lines.append("")
    if anatomy := floors.get("write_anatomy"):
        lines += ["## What one write commits", "",
                  "In-process, memoryd's own store and ledger functions on a copy of the 2,000-entry store, one "
                  "`synchronous=FULL` transaction per write, one layer more per row (`bench/anatomy.py`). "
                  "The last row is what a daemon commits for one `memory/add`.", "",
                  "| transaction | commits/s | µs per commit | WAL pages per commit | × the floor's rate |",
                  "| --- | --- | --- | --- | --- |"]
        for layer, a in anatomy.items():
            lines.append(f"| {layer} | {a['commits_per_s']:.0f} | {a['us_per_commit']:.0f} | "
                         f"{a['wal_pages_per_commit']:.1f} | {_x(_div(a['commits_per_s'], fl))} |")
        lines.append("")
    if r.get("seeding_s"):
        lines += ["Stores seeded with memoryd's store.py functions in " +
                  ", ".join(f"{float(s):.1f} s ({int(n):,} entries)" for n, s in r["seeding_s"].items()) + ".", ""]
    return "\n".join(lines)


def plot(r: dict[str, Any], path: Path) -> str | None:
    """The PNG; None, or why it was not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no plot"
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(18, 4.8), gridspec_kw={"width_ratios": [1, 1, 0.8]})
    w = r.get("writes") or {}
    auto = sorted((int(k.split("/")[1]), v["per_s"]) for k, v in w.items() if k.startswith("auto/"))
    ask = sorted((int(k.split("/")[1]), v["per_s"]) for k, v in w.items() if k.startswith("ask/"))
    if auto:
        a.plot([c for c, _ in auto], [v for _, v in auto], "o-", label="memoryd, policy auto")
    if ask:
        a.plot([c for c, _ in ask], [v for _, v in ask], "s--", label="memoryd, policy ask (auto-answered)")
    fl = _get(r, "floors", "sqlite_full_commits_per_s")
    if fl:
        a.axhline(fl, color="grey", linestyle=":", label="floor: sqlite3 FULL one-row commits")
    pw = _get(r, "peer", "writes", "per_s")
    if pw:
        a.plot([1], [pw], "x", markersize=10, color="red", label="server-memory (1 stdio client)")
    mcp_plot(r, a, b, c)
    mcp_sessions = [int(k.split("/")[1]) for k in _get(r, "mcp", "writes") or {} if k.startswith("auto/")]
    a.set_xscale("log", base=2)
    ticks = sorted({c for c, _ in auto + ask} | {1} | set(mcp_sessions))
    a.set_xticks(ticks, [str(c) for c in ticks])
    a.set_ylim(bottom=0)
    a.set_xlabel("concurrent clients")
    a.set_ylabel("acked writes / s")
    a.set_title("memory/add throughput")
    a.legend(fontsize=8)
    q = r.get("query") or {}
    sizes = sorted(int(n) for n in q)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, label in enumerate(NEEDLES):
        color = colors[i % len(colors)]
        if sizes:
            b.plot(sizes, [q[str(n)][label]["p50_us"] / 1000 for n in sizes], "o-", color=color, label=label)
        scan = [(_get(r, "floors", "scan", str(n), label, "p50_us"), n) for n in sizes]
        if scan and all(s is not None for s, _ in scan):
            b.plot(sizes, [s / 1000 for s, _ in scan], ":", color=color)
        pq = [(_get(r, "peer", "query", str(n), label, "p50_us"), n) for n in sizes]
        if pq and all(s is not None for s, _ in pq):
            b.plot(sizes, [s / 1000 for s, _ in pq], "x--", color=color, alpha=0.5)
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("entries in the store")
    b.set_ylabel("p50 round trip, ms")
    b.set_title("memory/query (solid) · in-process scan (dotted) · server-memory (x, dashed) · memoryd mcp (◇)")
    b.title.set_fontsize(9)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_all(r: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    js = out / "results.json"
    js.write_text(json.dumps(r, indent=2, ensure_ascii=False) + "\n")
    written.append(js)
    md = out / "RESULTS.md"
    md.write_text(markdown(r) + "\n")
    written.append(md)
    png = out / "results.png"
    why = plot(r, png)
    if why is None:
        written.append(png)
    else:
        print(f"[bench] {why}", flush=True)
    return written
