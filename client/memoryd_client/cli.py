"""``memoryctl``: manage memoryd from a shell (the reference provider's ``/memory`` verbs).

Exit status: 0 success; 1 the daemon refused (a protocol error such as BUDGET_EXCEEDED or
WRITE_DENIED), or ``audit verify`` found the ledger broken or missing; 2 usage (bad arguments, unreadable input file); 3 no daemon / connection
lost / timeout / autostart failed / stop failed; 130 interrupted. Every error is one line on stderr:
``error: <CODE>: <message>`` (with ``--json``, also ``{"error": {...}}`` on stdout).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from .commands import run_async
from .local import cmd_rpc, cmd_socket
from .manual import build_parser as build_parser
from .manual import cmd_completion
from .manual import verbs as verbs
from .running import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Ctx, _error, _socket, fail

# This module is memoryctl's front: the command line and the exit statuses. Every verb that
# talks to a daemon runs in memoryd_client.commands.


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not args.verb:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    ctx = Ctx(args, socket=_socket(args), fit=_isatty(sys.stdout))
    if args.verb in ("socket", "rpc", "completion"):  # no client, no autostart
        return _local(ctx)
    try:
        return run_async(ctx)
    except BrokenPipeError:  # `memoryctl list | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        if args.verb == "approve":
            print("", file=sys.stderr)
            return EXIT_OK
        if args.verb == "watch":  # Ctrl-C before the watch began: as quiet as after
            return EXIT_OK
        _error(None, "INTERRUPTED", "interrupted")
        return EXIT_INTERRUPTED


def _local(ctx: Ctx) -> int:
    command = {"socket": cmd_socket, "rpc": cmd_rpc, "completion": cmd_completion}[ctx.args.verb]
    try:
        return command(ctx)
    except Exception as exc:
        return fail(ctx, exc)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
