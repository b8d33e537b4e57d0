"""memoryctl's argparse parser, built from the verb table (:data:`memoryd_client.verbtable.VERBS`).
Both the front (memoryd_client.cli) and the manual and completion scripts
(memoryd_client.manual) build it, so it lives apart from either."""

from __future__ import annotations

import inspect

from memoryd_protocol import __version__
from memoryd_protocol.constants import PROTOCOL

from .parsing import FORMATTER, Parser, Verb, _global_options
from .running import PROG
from .verbtable import VERBS


def build_parser(*, global_help: bool = False) -> Parser:
    """memoryctl's parser, every verb's with it. With ``global_help`` each verb's help lists
    the global options too (the completion scripts read it to complete them after a verb)."""
    parser = Parser(
        prog=PROG,
        formatter_class=FORMATTER,
        description=inspect.cleandoc("""
            Manage memoryd, the local memory daemon (dsh-memory-protocol v1): read, write,
            audit, import and export memory, and approve writes.

            memoryctl connects to the daemon's socket and starts a daemon there when none
            answers (--no-autostart to disable). Writes under write policy 'ask' show the
            complete change and ask 'Approve? [y/N]' on the terminal; without a terminal
            they are denied unless --yes is given.
        """).strip(),
        epilog=inspect.cleandoc("""
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
    sub = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs", parser_class=Verb)
    for verb in VERBS:
        parser.verb_parsers[verb.name] = sub.add_parser(
            verb.name, help=verb.summary, summary=verb.summary, description=verb.description, epilog=verb.epilog,
            formatter_class=FORMATTER, global_help=global_help, arguments=verb.arguments)
    return parser


def verbs(parser: Parser | None = None) -> dict[str, Verb]:
    """Verb name → its parser (for docs and tests)."""
    return (parser or build_parser()).verb_parsers
