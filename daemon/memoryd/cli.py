"""``memoryd``: the daemon's command line.

Three ways to run ``serve``:

- ``memoryd serve`` owns the store and serves it on the Unix socket (the shared daemon);
- ``memoryd serve --stdio`` is a harness's way in to that daemon: it relays stdin/stdout to
  the socket, starting the daemon when none runs (:mod:`memoryd.relay`);
- ``memoryd serve --stdio --standalone`` owns a store privately and serves one client on
  stdin/stdout (tests, sandboxes).

Only the daemon paths import the daemon's stack (:mod:`memoryd.app`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from memoryd_protocol import __version__
from memoryd_protocol.constants import WRITE_POLICIES
from memoryd_protocol.paths import log_path_for

from . import config as config_mod
from . import relay, replica_cli, units
from .errors import DaemonError
from .rundir import UnsafeDir, ensure_private_dir

#: the values --log-level allows
LOG_LEVELS = ("debug", "info", "warning", "error")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memoryd", description="memoryd: the dsh-memory-protocol v1 daemon.")
    parser.add_argument("--version", action="version", version=f"memoryd {__version__} (dsh-memory-protocol/v1)")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="run the daemon, or attach a harness to it over stdio",
        description="Serve JSON-RPC 2.0 (NDJSON) on a Unix socket. With --stdio, relay stdin/stdout to the daemon "
        "that serves the configured store (starting it when none runs); with --stdio --standalone, own a private "
        "store instead. The socket appears once the store is open and the daemon is ready.")
    serve.add_argument("--socket", type=Path, help="Unix socket path to serve, or with --stdio to attach to "
                       "(default: $MEMORYD_SOCKET, else $XDG_RUNTIME_DIR/memoryd/memoryd.sock)")
    serve.add_argument("--stdio", action="store_true",
                       help="speak the protocol on stdin/stdout: a harness's child process")
    serve.add_argument("--standalone", action="store_true",
                       help="with --stdio: own the store in this process instead of relaying to the shared daemon")
    serve.add_argument("--detach", action="store_true",
                       help="start the daemon in the background and exit once it is ready")
    serve.add_argument("--db", type=Path, help="SQLite store (default: the per-user data dir's memory.db)")
    serve.add_argument("--config", type=Path,
                       help=f"TOML config file (default: {config_mod.DEFAULT_CONFIG_HINT} if it exists)")
    serve.add_argument("--write-policy", choices=WRITE_POLICIES, help="override the config's write_policy")
    serve.add_argument("--log-level", default=None, choices=LOG_LEVELS,
                       help="stderr log level (default: $MEMORYD_LOG_LEVEL, else info)")
    mcp = sub.add_parser(
        "mcp", help="an MCP server on stdio, into the shared daemon (for Claude Code, Codex, Cursor, ...)",
        description="Serve MCP (the Model Context Protocol) on stdin/stdout for an agent host: a relay into the "
        "daemon that serves the configured store, which it starts when none runs. Each process is one memory "
        "session; its writes pass the daemon's budgets, approval gate and ledger.")
    mcp.add_argument("--socket", type=Path, help="the daemon's Unix socket (default: $MEMORYD_SOCKET, else "
                     "$XDG_RUNTIME_DIR/memoryd/memoryd.sock)")
    mcp.add_argument("--db", type=Path, help="the store the daemon must serve (refused when it serves another)")
    mcp.add_argument("--config", type=Path,
                     help=f"TOML config file (default: {config_mod.DEFAULT_CONFIG_HINT} if it exists)")
    mcp.add_argument("--write-policy", choices=WRITE_POLICIES,
                     help="refuse to attach unless the daemon runs this write policy")
    mcp.add_argument("--cwd", type=Path, help="the session's workspace (default: the current directory, where "
                     "hosts start MCP servers)")
    mcp.add_argument("--agent", help="give the host a private agent layer (default: the layer every agent "
                     "shares, so every host reads the same memory)")
    mcp.add_argument("--log-level", default=None, choices=LOG_LEVELS,
                     help="log level of a daemon started on this session's behalf")
    units.add_parser(sub)
    replica_cli.add_parser(sub)
    return parser


def _forwarded(args: argparse.Namespace, config_path: Path | None) -> list[str]:
    """The options a daemon started on our behalf gets (absolute: it runs in /)."""
    out: list[str] = []
    if args.db is not None:
        out += ["--db", str(args.db.expanduser().absolute())]
    if config_path is not None:
        out += ["--config", str(config_path.absolute())]
    if args.write_policy is not None:
        out += ["--write-policy", args.write_policy]
    if args.log_level is not None:
        out += ["--log-level", args.log_level]
    return out


def main(argv: list[str] | None = None) -> int:
    """Every :class:`~memoryd.errors.DaemonError` ends here: one line on stderr and its
    exit code, never a traceback."""
    try:
        return _main(argv)
    except DaemonError as exc:
        print(f"memoryd: {exc}", file=sys.stderr)
        return exc.exit_code


def serve_config(args: argparse.Namespace) -> tuple[Path | None, config_mod.Config]:
    """The config file ``serve`` reads (or None) and the Config it runs with: that file,
    then ``--db``, ``--socket`` and ``--write-policy`` over it."""
    config_path = args.config.expanduser() if args.config is not None else config_mod.default_config_file()
    cfg = config_mod.load(config_path)
    if args.db is not None:
        cfg.db_path = args.db.expanduser().absolute()
    if args.socket is not None:
        cfg.socket_path = args.socket.expanduser().absolute()
    if args.write_policy is not None:
        cfg.write_policy = args.write_policy
    return config_path, cfg


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "systemd-units":
        return units.run(args)
    if args.command == "replica":
        return replica_cli.run(args)
    if args.command == "mcp":
        args.stdio, args.standalone, args.detach = True, False, False
    if args.standalone and not args.stdio:
        parser.error("--standalone needs --stdio")
    if args.standalone and args.socket is not None:
        parser.error("--socket has no meaning with --standalone (a standalone daemon serves stdio only)")
    if args.detach and args.stdio:
        parser.error("--detach cannot be combined with --stdio")
    config_path, cfg = serve_config(args)

    if args.stdio and not args.standalone:
        explicit_db = cfg.db_path if (args.db is not None or cfg.db_path_configured) else None
        try:
            return relay.relay_stdio(str(cfg.socket_path), None if explicit_db is None else str(explicit_db),
                                     args.write_policy, _forwarded(args, config_path),
                                     _mcp_session(vars(args)) if args.command == "mcp" else None,
                                     default_socket=args.socket is None and not cfg.socket_configured
                                     and not os.environ.get("MEMORYD_SOCKET"))
        except KeyboardInterrupt:
            return 130
    if args.detach:
        return _detach(cfg.socket_path, _forwarded(args, config_path))

    from .app import serve  # the daemon's whole stack: only a daemon imports it

    level = args.log_level or os.environ.get("MEMORYD_LOG_LEVEL", "info")
    return serve(cfg, stdio=args.stdio, log_level=level)


def _mcp_session(values: dict[str, Any]) -> tuple[str, str | None] | None:
    """``memoryd mcp``'s workspace (``--cwd``, else the working directory, where hosts start
    their MCP servers) and agent (``--agent``, else None: the host's name decides)."""
    if values["command"] != "mcp":
        return None
    cwd = values["cwd"]
    if cwd is not None:
        return _given_workspace(str(cwd)), values["agent"]
    try:
        return os.getcwd(), values["agent"]
    except OSError as exc:
        raise DaemonError(f"cannot read the working directory ({exc.strerror}); give --cwd") from None


def _given_workspace(cwd: str) -> str:
    """``--cwd`` as given: an absolute path. A host that does not expand its variables hands
    them on as they are, and a relative path would name another workspace in every directory."""
    start = cwd.find("${")
    if start >= 0:
        end = cwd.find("}", start)
        variable = cwd[start:end + 1] if end >= 0 else cwd[start:]
        raise DaemonError(f"--cwd {cwd!r} holds {variable}, a variable your MCP host did not expand; give "
                          "the project's absolute path, or leave --cwd out (hosts start MCP servers in the project)")
    if not cwd.startswith("/"):
        raise DaemonError(f"--cwd {cwd!r} is not an absolute path; give the project's absolute path, or leave "
                          "--cwd out (hosts start MCP servers in the project)")
    return os.path.normpath(cwd)


def _detach(socket_path: Path, serve_args: list[str]) -> int:
    """``serve --detach``: start the daemon in the background, print its pid once it is
    ready. Exit status 0 (also when one already answers), else the daemon's own."""
    import signal

    from . import launch  # subprocess and its kin: only a start in the background needs them

    runtime = socket_path.parent
    log = log_path_for(socket_path)
    try:
        ensure_private_dir(runtime)  # before the lock and the log are created in it
        with launch.start_lock(runtime):
            if launch.answers(socket_path):
                print(f"memoryd: already running on {socket_path}", file=sys.stderr)
                return 0
            # A client that gives up on us (Node's autostart timeout sends SIGTERM) must not
            # leave a half-started daemon behind: these stop it before we exit.
            proc = launch.spawn_ready(["--socket", str(socket_path), *serve_args], log=log,
                                      cancel_on=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    except launch.LaunchFailed as exc:
        reason = str(exc)
        if not reason.startswith("memoryd: "):
            reason = f"memoryd: could not start on {socket_path}: {reason} (log: {log})"
        print(reason, file=sys.stderr)
        return exc.returncode or 1
    except UnsafeDir as exc:
        print(f"memoryd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the runtime dir, its lock or the log cannot be made
        print(f"memoryd: cannot start on {socket_path}: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    print(proc.pid)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
