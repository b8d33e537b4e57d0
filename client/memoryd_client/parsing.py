"""memoryctl's argparse classes, imported only when a command line is parsed with argparse.

memoryctl's read commands read a plain command line without argparse
(:func:`memoryd_client.quick.quick_args`): importing argparse, and building a parser (its
messages go through gettext, which imports locale and looks for translations on disk, and
its parse compiles regular expressions), was a sixth of ``memoryctl query``'s start-up. So
the classes that extend argparse's live here, not in :mod:`memoryd_client.cli`.
"""

from __future__ import annotations

import argparse
import sys

from memoryd_protocol.paths import default_socket

from .running import EXIT_USAGE, _columns, _Partial, _seconds

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    #: --socket, whose help names the default socket: filled in only when help is shown,
    #: since computing it can import tempfile (no $XDG_RUNTIME_DIR), a cost on every run
    socket_option: argparse.Action | None = None

    def __init__(self, *args: Any, partial: bool = False, **kwargs: Any) -> None:
        #: every option's strings, in the order added (for docs and tests: argparse keeps
        #: its own list only in a private attribute). Set first: argparse adds --help.
        self.option_strings: list[tuple[str, ...]] = []
        #: the verbs' parsers by name, as build_parser adds them
        self.verb_parsers: dict[str, Parser] = {}
        super().__init__(*args, **kwargs)
        #: built for some verbs only (build_parser(argv)): errors are the whole parser's to print
        self.partial = partial

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.option_strings.append(tuple(action.option_strings))
        return action

    def error(self, message: str) -> NoReturn:
        if self.partial:
            raise _Partial(message)
        sys.stderr.write(f"error: USAGE: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)

    def format_help(self) -> str:
        if self.socket_option is not None:
            self.socket_option.help = f"daemon socket (default: $MEMORYD_SOCKET, else {default_socket()})"
        return super().format_help()


class Formatter(argparse.RawDescriptionHelpFormatter):
    """The help formatter, told the terminal's width (:func:`_columns`) as argparse would
    find it itself: argparse makes a formatter for every option it adds, and the first one
    imported shutil, a tenth of what the read commands' quick path costs otherwise."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class Verb(Parser):
    """A verb's parser, given its options (the global ones, then ``arguments``) when it is
    first used, to parse or to print help. Seventeen verbs with a dozen options each took
    most of memoryctl's start-up to build, and a run uses one of them."""

    def __init__(self, *args: Any, arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                 global_options: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments = arguments
        self._global_options = global_options
        self._complete = False

    def complete(self) -> Verb:
        """Add the options, once."""
        if not self._complete:
            self._complete = True
            if self._global_options:
                _global_options(self, suppress=True)
            if self._arguments is not None:
                self._arguments(self)
        return self

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self.complete()
        return super().parse_known_args(*args, **kwargs)

    def format_usage(self) -> str:
        self.complete()
        return super().format_usage()

    def format_help(self) -> str:
        self.complete()
        return super().format_help()


#: the formatter of memoryctl's parsers
FORMATTER = Formatter

__all__ = ["FORMATTER", "Formatter", "Parser", "Verb"]


def _positive_seconds(raw: str) -> float:
    value = _seconds(raw)
    if value is None:
        import argparse

        try:
            float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {raw!r}") from None
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {raw!r}")
    return value

def _global_options(parser: Parser, *, suppress: bool) -> None:
    """The options every verb takes, before or after the verb. On the verbs' parsers the
    defaults are suppressed, so an option given before the verb is not reset after it."""
    import argparse

    def d(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    g = parser.add_argument_group("connection and context (any position)")
    parser.socket_option = g.add_argument(
        "--socket",
        metavar="PATH",
        default=d(None),
        help="daemon socket (see memoryd_client.parsing.Parser.format_help)",
    )
    g.add_argument(
        "--db",
        metavar="PATH",
        default=d(None),
        help="store for an autostarted daemon (memoryd serve --db); warns if a running daemon uses another",
    )
    g.add_argument("--config", metavar="PATH", default=d(None), help="config file for an autostarted daemon")
    g.add_argument(
        "--no-autostart",
        action="store_true",
        default=d(False),
        help="fail (exit 3) instead of starting a daemon when none answers",
    )
    g.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=d(30.0),
        help="seconds to wait for each answer, not counting time at the approval prompt (default 30)",
    )
    g.add_argument(
        "--json",
        action="store_true",
        default=d(False),
        help="print the result as JSON (the wire shape) instead of a table",
    )
    g.add_argument(
        "-y",
        "--yes",
        action="store_true",
        default=d(False),
        help="approve this command's writes without asking (the payload is still shown on stderr)",
    )
    g.add_argument(
        "--via-approver",
        action="store_true",
        default=d(False),
        help="do not ask here: send this command's writes to a running 'memoryctl approve' (denied at once "
        "when none is subscribed); for scripts and cron jobs",
    )
    g.add_argument(
        "--workspace",
        "--cwd",
        dest="workspace",
        metavar="DIR",
        default=d(None),
        help="session working directory: the workspace of 'workspace' entries (default: current directory)",
    )
    g.add_argument(
        "--agent",
        metavar="KEY",
        default=d(""),
        help="session agent preset; '' (default) is the shared layer every agent sees",
    )
    g.add_argument(
        "--session",
        metavar="ID",
        default=d(None),
        help="session id for writes and snapshots (default: memoryctl-<pid>)",
    )
