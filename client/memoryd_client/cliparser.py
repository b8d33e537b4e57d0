"""memoryctl's argparse parser, built whole or for the verbs a command line can be running.
Both the front (memoryd_client.cli) and the manual and completion scripts
(memoryd_client.manual) build it, so it lives apart from either."""

from __future__ import annotations

from memoryd_protocol import __version__
from memoryd_protocol.constants import PROTOCOL

from .running import PROG
from .verbtable import VERB_NAMES, _Only, add_verbs, cleandoc

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .parsing import Parser

# argparse and the parser classes (memoryd_client.parsing) are imported only when a parser is
# built, which a plain read command's line never needs.


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
    # same Namespace (their defaults are suppressed there), and less to build.
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
