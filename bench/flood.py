"""MCP hosts that pipeline calls and never read: the daemon's RSS while they flood and after
they close.

    python -m bench.flood [--hosts 250] [--calls 600] [--entries 0] [--base DIR]

Each host is an MCP session over the daemon's socket (``mcp/attach``, as ``memoryd mcp``
sends it; no relay processes, whose own memory is not the daemon's), initialized, then sent
``--calls`` ``memory_list`` calls at once, and never read again. The daemon's RSS is sampled
every 0.2 s until every call has been served (its CPU time stops growing), then the hosts
close and it is read again once ``daemon/status`` shows no connection but the probe's.
``--base``: a checkout whose ``protocol/`` and ``daemon/`` the daemon imports instead (the
build before).
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from .common import Line, _env, rss_kb, seed_store

_enc = msgspec.json.Encoder()


def _msg(id_: Any, method: str, params: Any) -> bytes:
    return _enc.encode({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}) + b"\n"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def _connections(sock: str) -> int:
    c = Line(sock)
    try:
        return int(c.call("daemon/status", {})["connections"])
    finally:
        c.close()


def flood(hosts: int, calls: int, entries: int, base: Path | None = None) -> dict[str, Any]:
    from memoryd.launch import spawn_ready

    with tempfile.TemporaryDirectory(prefix="mdf-", dir="/tmp") as d:
        tmp = Path(d)
        db = tmp / "m.db"
        if entries:
            seed_store(db, entries)
        sock = str(tmp / "d.sock")
        cfg = tmp / "d.toml"
        cfg.write_text("max_connections = 4096\n")
        args = ["--socket", sock, "--db", str(db), "--config", str(cfg), "--write-policy", "auto",
                "--log-level", "warning"]
        proc = spawn_ready(args, log=tmp / "d.log", env=_env(tmp, base))
        pid = proc.pid
        try:
            out: dict[str, Any] = {"hosts": hosts, "calls": calls, "entries": entries, "idle_kb": rss_kb(pid)}
            head = (_msg("attach", "mcp/attach", {"cwd": "/bench"})
                    + _msg(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                             "clientInfo": {"name": "flood", "version": "1"}})
                    + b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            body = b"".join(_msg(i, "tools/call", {"name": "memory_list", "arguments": {}})
                            for i in range(1, calls + 1))
            peak = [0]
            stop = threading.Event()

            def sample() -> None:
                while not stop.wait(0.2):
                    peak[0] = max(peak[0], rss_kb(pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            socks = []
            t = time.perf_counter()
            for _ in range(hosts):
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                s.sendall(head + body)  # the kernel takes it all: the daemon reads it as it serves
                socks.append(s)
            # served: the daemon's CPU time stops growing (a second without a tick of it)
            last = _cpu_s(pid)
            while True:
                time.sleep(1.0)
                now = _cpu_s(pid)
                if now == last:
                    break
                last = now
            out["served_s"] = round(time.perf_counter() - t - 1.0, 1)
            out["loaded_kb"] = rss_kb(pid)
            out["connections_open"] = _connections(sock) - 1
            for s in socks:
                s.close()
            while _connections(sock) > 1:
                time.sleep(0.2)
            stop.set()
            sampler.join()
            out["peak_kb"] = max(peak[0], rss_kb(pid, "VmHWM"))
            out["after_close_kb"] = rss_kb(pid)
            out["dropped_lines"] = (tmp / "d.log").read_text().count("dropping a connection that stopped reading")
            return out
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=250)
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--entries", type=int, default=0)
    ap.add_argument("--base", type=Path)
    a = ap.parse_args()
    r = flood(a.hosts, a.calls, a.entries, a.base)
    print(msgspec.json.encode(r).decode())
    mb = {k: round(v / 1024, 1) for k, v in r.items() if k.endswith("_kb")}
    print(f"{a.hosts} hosts × {a.calls} memory_list, {a.entries} entries: idle {mb['idle_kb']} MB, peak "
          f"{mb['peak_kb']} MB, all served {mb['loaded_kb']} MB, after close {mb['after_close_kb']} MB "
          f"({r['served_s']} s; {r['connections_open']} hosts still connected when served)")


if __name__ == "__main__":
    main()
