"""``memoryctl``: manage memoryd from a shell (the reference provider's ``/memory`` verbs).

Exit status: 0 success; 1 the daemon refused (a protocol error such as BUDGET_EXCEEDED or
WRITE_DENIED), or ``audit verify`` found the ledger broken or missing; 2 usage (bad arguments, unreadable input file); 3 no daemon / connection
lost / timeout / autostart failed / stop failed; 130 interrupted. Every error is one line on stderr:
``error: <CODE>: <message>`` (with ``--json``, also ``{"error": {...}}`` on stdout).
"""

from __future__ import annotations

import os
import sys

from memoryd_protocol import __version__
from memoryd_protocol.constants import PROTOCOL

from .quick import LEAN_VERBS, quick_args, run_quick
from .running import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, PROG, Ctx, _error, _Partial, _socket
from .verbtable import VERB_NAMES, _Only, add_verbs, cleandoc

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from types import SimpleNamespace
    from typing import Any

    from .parsing import Parser

    #: a command line read: by argparse, or by quick_args (a read command's plain one)
    Args = argparse.Namespace | SimpleNamespace

# This module is memoryctl's front: the command line and the exit statuses. A plain read
# command takes the quick path (memoryd_client.quick); every other verb runs in
# memoryd_client.commands, imported only then; argparse and the parser classes
# (memoryd_client.parsing) are imported only when a command line is not a plain read
# command's.


def _help_word(word: str) -> bool:
    """Whether ``word`` may ask for help: ``-h``, ``--help`` or an abbreviation of it, or
    a cluster of short options with ``h`` in it (``-yh``)."""
    option = word.partition("=")[0]
    if option.startswith("--"):
        return len(option) > 2 and "--help".startswith(option)
    return option.startswith("-") and "h" in option


def _named_verbs(argv: Sequence[str]) -> frozenset[str] | None:
    """The verbs ``argv`` can be running: every word that is a verb's name (one may be an
    option's value, ``--agent list query``). None, for all of them, when it names none or
    may ask for help, which lists them all."""
    named = frozenset(w for w in argv if w in VERB_NAMES)
    if not named or any(_help_word(w) for w in argv):
        return None
    return named


def _options_after_a_verb(argv: Sequence[str]) -> bool:
    """Whether a word that starts with ``-`` follows the first word that is a verb's name."""
    verb = next((i for i, w in enumerate(argv) if w in VERB_NAMES), len(argv))
    return any(w.startswith("-") for w in argv[verb + 1:])



def build_parser(argv: Sequence[str] | None = None, *, global_help: bool = False) -> Parser:
    """memoryctl's parser. With ``argv``, only the verbs it can be running get their parser
    (:func:`_named_verbs`): building seventeen of them, each with a dozen options, was most of
    memoryctl's start-up. Such a parser raises :class:`_Partial` instead of printing an
    error, since the message may list the verbs (:func:`main` parses again with them all)."""
    from .parsing import FORMATTER, Parser, Verb, _global_options

    only = None if argv is None else _named_verbs(argv)
    # A verb's parser without the dozen global options when no option follows a verb: the
    # same Namespace (their defaults are suppressed there), a millisecond less.
    globals_on_verbs = only is None or argv is None or _options_after_a_verb(argv)
    parser = Parser(
        partial=only is not None,
        prog=PROG,
        formatter_class=FORMATTER,
        description=cleandoc("""
            Manage memoryd, the local memory daemon (dsh-memory-protocol v1): read, write,
            audit, import and export memory, and approve writes.

            memoryctl connects to the daemon's socket and starts a daemon there when none
            answers (--no-autostart to disable). Writes under write policy 'ask' show the
            complete change and ask 'Approve? [y/N]' on the terminal; without a terminal
            they are denied unless --yes is given.
        """).strip(),
        epilog=cleandoc("""
            exit status:
              0    ok
              1    the daemon refused (its error code is on stderr), or audit verify found
                   the ledger broken
              2    usage: bad arguments, an unreadable input file
              3    no daemon, connection lost, timeout, or stop failed
              130  interrupted

            Run 'memoryctl VERB --help' for a verb's own options, 'man memoryctl' for the
            manual, and 'memoryctl completion bash|zsh|fish' for shell completion.
        """).strip(),
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {__version__} ({PROTOCOL})", help="print the version and exit"
    )
    _global_options(parser, suppress=False)
    sub = _Only(parser.add_subparsers(dest="verb", metavar="VERB", title="verbs", parser_class=Verb), only,
                globals_on_verbs, parser.verb_parsers, global_help)

    add_verbs(sub)
    return parser


def verbs(parser: Parser | None = None) -> dict[str, Parser]:
    """Verb name → its parser, with its options added (for docs and tests)."""
    from .parsing import Verb

    parser = parser or build_parser()
    return {name: p.complete() if isinstance(p, Verb) else p for name, p in parser.verb_parsers.items()}


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
