"""memoryctl's argparse classes, imported only when a command line is parsed with argparse.

memoryctl's read commands read a plain command line without argparse
(:func:`memoryd_client.quick.quick_args`): importing argparse, and building a parser (its
messages go through gettext, which imports locale and looks for translations on disk, and
its parse compiles regular expressions), is a large part of ``memoryctl query``'s start-up. So
the classes that extend argparse's live here, not in :mod:`memoryd_client.cli`.
"""

from __future__ import annotations

import argparse
import re
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
        #: every argument's action, in the order added (the global options' included)
        self.added: list[argparse.Action] = []
        #: the verbs' parsers by name, as build_parser adds them
        self.verb_parsers: dict[str, Parser] = {}
        super().__init__(*args, **kwargs)
        #: built for some verbs only (build_parser(argv)): errors are the whole parser's to print
        self.partial = partial

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.option_strings.append(tuple(action.option_strings))
        self.added.append(action)
        return action

    def error(self, message: str) -> NoReturn:
        if self.partial:
            raise _Partial(message)
        sys.stderr.write(f"error: USAGE: {did_you_mean(message)} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)

    def format_help(self) -> str:
        if self.socket_option is not None:
            self.socket_option.help = f"daemon socket (default: $MEMORYD_SOCKET, else {default_socket()})"
        return super().format_help()


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def did_you_mean(message: str) -> str:
    """argparse's message for a mistyped verb, action or choice, with the list of choices
    replaced by the closest ones when some are close (as git's "did you mean")."""
    found = _INVALID_CHOICE.search(message)
    if found is None:
        return message
    import difflib

    close = difflib.get_close_matches(found[1], re.findall(r"'([^']*)'", found[2]), n=3, cutoff=0.6)
    if not close:
        return message
    return f"{message[:found.start()]}invalid choice: {found[1]!r}; did you mean {' or '.join(map(repr, close))}?"


class Formatter(argparse.RawDescriptionHelpFormatter):
    """The help formatter, told the terminal's width (:func:`_columns`) as argparse would
    find it itself: argparse makes a formatter for every option it adds, and the first one
    imported shutil, which the read commands' quick path never needs."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class Verb(Parser):
    """A verb's parser, given its options (the global ones, then ``arguments``) when it is
    first used, to parse or to print help. Seventeen verbs with a dozen options each took
    most of memoryctl's start-up to build, and a run uses one of them."""

    def __init__(self, *args: Any, arguments: Callable[[Verb], object] | None = None,
                 global_options: bool = True, global_help: bool = False, summary: str = "",
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the one line that the verbs' list shows
        self.summary = summary
        self._arguments = arguments
        self._global_options = global_options
        #: whether the global options are in this verb's help (the completion scripts')
        self.global_help = global_help
        self._complete = False
        self._action_choices: Any = None
        #: a verb's actions' parsers by name (``audit verify``), as :meth:`add_action` adds them
        self.action_parsers: dict[str, Verb] = {}

    def add_action(self, name: str, summary: str, description: str, epilog: str | None,
                   arguments: Callable[[Verb], object] | None = None) -> None:
        """A nested verb (``audit verify``): its own parser, help and options, the global
        options included. With none named, the verb runs its first action."""
        if self._action_choices is None:
            self._action_choices = self.add_subparsers(dest="action", metavar="ACTION", title="actions",
                                                       parser_class=Verb)
        self.action_parsers[name] = self._action_choices.add_parser(
            name, help=summary, summary=summary, description=description, epilog=epilog, formatter_class=FORMATTER,
            partial=self.partial, global_options=self._global_options, global_help=self.global_help,
            arguments=arguments)

    def complete(self) -> Verb:
        """Add the options, once (and the actions' own, for docs and tests)."""
        if not self._complete:
            self._complete = True
            if self._global_options:
                _global_options(self, suppress=True, hidden=not self.global_help)
            if self._arguments is not None:
                self._arguments(self)
        return self

    def actions_completed(self) -> dict[str, Verb]:
        """:attr:`action_parsers`, each with its options added."""
        self.complete()
        return {name: p.complete() for name, p in self.action_parsers.items()}

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self.complete()
        argv = args[0] if args else kwargs.get("args")
        if argv is not None and not self.action_parsers:  # a verb with actions: its action checks
            self._refuse_unknown_options(list(argv))
        return super().parse_known_args(*args, **kwargs)

    def _refuse_unknown_options(self, argv: list[str]) -> None:
        """Name a long option this verb does not know, as git does: argparse would first
        complain that the option it was probably meant to be is required."""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        for word in argv:
            if word == "--":
                return
            name = word.split("=", 1)[0]
            if not name.startswith("--") or name == "--" or any(o.startswith(name) for o in known):
                continue  # not a long option, or one argparse takes (abbreviations included)
            import difflib

            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            self.error(f"unrecognized option {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""))

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

class _Hidden:
    """An argument group whose options are left out of the help."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return self.group.add_argument(*args, **{**kwargs, "help": argparse.SUPPRESS})  # type: ignore[no-any-return]


class _Recorded:
    """An argument group whose options are recorded in :attr:`Parser.added`."""

    def __init__(self, group: Any, parser: Parser) -> None:
        self.group, self.parser = group, parser

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action: argparse.Action = self.group.add_argument(*args, **kwargs)
        self.parser.added.append(action)
        return action


def _global_options(parser: Parser, *, suppress: bool, hidden: bool = False) -> None:
    """The options every verb takes, before or after the verb. On the verbs' parsers the
    defaults are suppressed, so an option given before the verb is not reset after it."""
    import argparse

    def d(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    # A verb's help leaves them out (it points to memoryctl --help): a dozen options
    # repeated in every verb's help buried the verb's own.
    group = _Recorded(parser.add_argument_group("connection and context (any position)"), parser)
    g = _Hidden(group) if hidden else group
    socket_option = g.add_argument(
        "--socket",
        metavar="PATH",
        default=d(None),
        # the path itself is filled in when --help is shown (Parser.format_help)
        help="daemon socket (default: $MEMORYD_SOCKET, else $XDG_RUNTIME_DIR/memoryd/memoryd.sock)",
    )
    if not suppress:
        parser.socket_option = socket_option
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
