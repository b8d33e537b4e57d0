"""``memoryd serve``: the daemon's command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import anyio
from memoryd_protocol.errors import ProtocolError
from memoryd_protocol.paths import default_config_path

from . import __version__
from . import config as config_mod
from .app import Daemon, StoreLocked
from .transports import SocketInUse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memoryd", description="memoryd: the dsh-memory-protocol v1 daemon.")
    parser.add_argument("--version", action="version", version=f"memoryd {__version__} (dsh-memory-protocol/v1)")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the daemon", description="Serve JSON-RPC 2.0 (NDJSON) on a Unix socket "
                           "or on stdio. The socket appears once the store is open and the daemon is ready.")
    where = serve.add_mutually_exclusive_group()
    where.add_argument("--socket", type=Path, help="Unix socket path (default: $XDG_RUNTIME_DIR/memoryd/memoryd.sock)")
    where.add_argument("--stdio", action="store_true", help="serve one client on stdin/stdout (a harness child)")
    serve.add_argument("--db", type=Path, help="SQLite store (default: the per-user data dir's memory.db)")
    serve.add_argument("--config", type=Path, help=f"TOML config file (default: {default_config_path()} if it exists)")
    serve.add_argument("--write-policy", choices=["ask", "auto", "off"], help="override the config's write_policy")
    serve.add_argument("--log-level", default=os.environ.get("MEMORYD_LOG_LEVEL", "info"),
                       choices=["debug", "info", "warning", "error"], help="stderr log level (default: info)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s memoryd[%(process)d] %(levelname)s %(name)s: %(message)s")
    config_path = args.config
    if config_path is None and default_config_path().exists():
        config_path = default_config_path()
    try:
        cfg = config_mod.load(config_path)
    except config_mod.ConfigError as exc:
        print(f"memoryd: {exc}", file=sys.stderr)
        return 2
    if args.db is not None:
        cfg.db_path = args.db.expanduser().absolute()
    if args.socket is not None:
        cfg.socket_path = args.socket.expanduser().absolute()
    if args.write_policy is not None:
        cfg.write_policy = args.write_policy
    return anyio.run(_serve, cfg, args.stdio)


async def _serve(cfg: config_mod.Config, stdio: bool) -> int:
    try:
        daemon = await Daemon.open(cfg)
    except ProtocolError as exc:
        print(f"memoryd: {exc.code}: {exc.message}: {cfg.db_path}", file=sys.stderr)
        return 1
    except StoreLocked as exc:
        print(f"memoryd: STORE_LOCKED: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"memoryd: cannot open store {cfg.db_path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        await daemon.run(stdio=stdio)
    except SocketInUse as exc:
        print(f"memoryd: {exc}", file=sys.stderr)
        await daemon.close()
        return 1
    except BaseException:
        # aiosqlite's threads are not daemonic: close the store or the process never exits
        await daemon.close()
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
