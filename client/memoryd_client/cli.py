"""``memoryctl``: manage memoryd from a shell (the reference provider's ``/memory`` verbs).

Exit status: 0 success; 1 the daemon refused (a protocol error such as BUDGET_EXCEEDED or
WRITE_DENIED), or ``audit verify`` found the ledger broken or missing; 2 usage (bad arguments, unreadable input file); 3 no daemon / connection
lost / timeout / autostart failed / stop failed; 130 interrupted. Every error is one line on stderr:
``error: <CODE>: <message>`` (with ``--json``, also ``{"error": {...}}`` on stdout).
"""

from __future__ import annotations

import os
import sys

from .cliparser import build_parser as build_parser
from .cliparser import verbs as verbs
from .quick import LEAN_VERBS, quick_args, run_quick
from .running import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Ctx, _error, _Partial, _socket

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from types import SimpleNamespace
    from typing import Any


    #: a command line read: by argparse, or by quick_args (a read command's plain one)
    Args = argparse.Namespace | SimpleNamespace

# This module is memoryctl's front: the command line and the exit statuses. A plain read
# command takes the quick path (memoryd_client.quick); every other verb runs in
# memoryd_client.commands, imported only then; argparse and the parser classes
# (memoryd_client.parsing) are imported only when a command line is not a plain read
# command's.


def _parse_all(words: list[str]) -> argparse.Namespace | int:
    """``words`` read by argparse, or the exit status when it printed help or an error."""
    parser = build_parser(words)
    try:
        try:
            return _parse(parser, words)
        except _Partial:  # the parser with every verb says what is wrong
            parser = build_parser()
            return _parse(parser, words)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parse_args``; a verb with actions (``audit``, ``proposals``) named alone lists."""
    args = parser.parse_args(argv)
    if getattr(args, "verb", None) in ("audit", "proposals") and args.action is None:
        args.action = "list"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    quick = quick_args(words)
    parsed = _parse_all(words) if quick is None else quick
    if isinstance(parsed, int):
        return parsed
    args: Args = parsed
    if not args.verb:
        build_parser().print_help(sys.stderr)
        return EXIT_USAGE
    ctx = Ctx(args, socket=_socket(args), fit=_isatty(sys.stdout))
    if args.verb in ("socket", "rpc", "completion"):  # no client, no autostart
        return _local(ctx)
    try:
        if args.verb in LEAN_VERBS and not args.json:
            return run_quick(ctx)
        from .commands import run_async

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
    from .local import cmd_rpc, cmd_socket
    from .manual import cmd_completion
    from .running import fail

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
