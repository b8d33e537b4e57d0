"""memoryctl's argparse classes: the parser, a verb's parser (with its actions), the
"did you mean" for a mistyped word, and the global options every verb takes."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from memoryd_protocol.paths import default_socket_path

from .running import EXIT_USAGE, _seconds

#: the formatter of memoryctl's parsers: descriptions and epilogs keep their lines
FORMATTER = argparse.RawDescriptionHelpFormatter


class Parser(argparse.ArgumentParser):
    #: --socket, whose help names the default socket: filled in when help is shown, so the
    #: man page, generated from the parser, names the variables rather than one user's path
    socket_option: argparse.Action | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: every option's strings, in the order added (for docs and tests: argparse keeps
        #: its own list only in a private attribute). Set first: argparse adds --help.
        self.option_strings: list[tuple[str, ...]] = []
        #: every argument's action, in the order added (the global options' included)
        self.added: list[argparse.Action] = []
        #: the verbs' parsers by name, as build_parser adds them
        self.verb_parsers: dict[str, Verb] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.option_strings.append(tuple(action.option_strings))
        self.added.append(action)
        return action

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: USAGE: {did_you_mean(message)} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)

    def format_help(self) -> str:
        if self.socket_option is not None:
            self.socket_option.help = f"daemon socket (default: $MEMORYD_SOCKET, else {default_socket_path()})"
        return super().format_help()


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def did_you_mean(message: str) -> str:
    """argparse's message for a mistyped verb, action or choice, with the list of choices
    replaced by the closest ones when some are close (as git's "did you mean")."""
    found = _INVALID_CHOICE.search(message)
    if found is None:
        return message
    close = difflib.get_close_matches(found[1], re.findall(r"'([^']*)'", found[2]), n=3, cutoff=0.6)
    if not close:
        return message
    return f"{message[:found.start()]}invalid choice: {found[1]!r}; did you mean {' or '.join(map(repr, close))}?"


class Verb(Parser):
    """A verb's parser: the global options (left out of its help unless ``global_help``,
    which the completion scripts need), then its own (``arguments``)."""

    def __init__(self, *args: Any, arguments: Callable[[Verb], object] | None = None,
                 global_help: bool = False, summary: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the one line that the verbs' list shows
        self.summary = summary
        #: whether the global options are in this verb's help (the completion scripts')
        self.global_help = global_help
        self._action_choices: Any = None
        #: a verb's actions' parsers by name (``audit verify``), as :meth:`add_action` adds them
        self.action_parsers: dict[str, Verb] = {}
        _global_options(self, suppress=True, hidden=not global_help)
        if arguments is not None:
            arguments(self)

    def add_action(self, name: str, summary: str, description: str, epilog: str | None,
                   arguments: Callable[[Verb], object] | None = None) -> None:
        """A nested verb (``audit verify``): its own parser, help and options, the global
        options included."""
        if self._action_choices is None:
            self._action_choices = self.add_subparsers(dest="action", metavar="ACTION", title="actions",
                                                       parser_class=Verb)
        self.action_parsers[name] = self._action_choices.add_parser(
            name, help=summary, summary=summary, description=description, epilog=epilog, formatter_class=FORMATTER,
            global_help=self.global_help, arguments=arguments)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
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
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            self.error(f"unrecognized option {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""))


__all__ = ["FORMATTER", "Parser", "Verb", "did_you_mean"]


def _positive_seconds(raw: str) -> float:
    value = _seconds(raw)
    if value is None:
        try:
            float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {raw!r}") from None
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {raw!r}")
    return value


def _global_options(parser: Parser, *, suppress: bool, hidden: bool = False) -> None:
    """The options every verb takes, before or after the verb. On the verbs' parsers the
    defaults are suppressed, so an option given before the verb is not reset after it."""
    def d(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    # A verb's help leaves them out (it points to memoryctl --help): a dozen options
    # repeated in every verb's help buried the verb's own.
    group = parser.add_argument_group("connection and context (any position)")

    def add(*args: Any, **kwargs: Any) -> argparse.Action:
        action = group.add_argument(*args, **({**kwargs, "help": argparse.SUPPRESS} if hidden else kwargs))
        parser.added.append(action)
        return action

    socket_option = add(
        "--socket",
        metavar="PATH",
        default=d(None),
        # the path itself is filled in when --help is shown (Parser.format_help)
        help="daemon socket (default: $MEMORYD_SOCKET, else $XDG_RUNTIME_DIR/memoryd/memoryd.sock)",
    )
    if not suppress:
        parser.socket_option = socket_option
    add(
        "--db",
        metavar="PATH",
        default=d(None),
        help="store for an autostarted daemon (memoryd serve --db); warns if a running daemon uses another",
    )
    add("--config", metavar="PATH", default=d(None), help="config file for an autostarted daemon")
    add(
        "--no-autostart",
        action="store_true",
        default=d(False),
        help="fail (exit 3) instead of starting a daemon when none answers",
    )
    add(
        "--timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=d(30.0),
        help="seconds to wait for each answer, not counting time at the approval prompt (default 30)",
    )
    add(
        "--json",
        action="store_true",
        default=d(False),
        help="print the result as JSON (the wire shape) instead of a table",
    )
    add(
        "-y",
        "--yes",
        action="store_true",
        default=d(False),
        help="approve this command's writes without asking (the payload is still shown on stderr)",
    )
    add(
        "--via-approver",
        action="store_true",
        default=d(False),
        help="do not ask here: send this command's writes to a running 'memoryctl approve' (denied at once "
        "when none is subscribed); for scripts and cron jobs",
    )
    add(
        "--workspace",
        "--cwd",
        dest="workspace",
        metavar="DIR",
        default=d(None),
        help="session working directory: the workspace of 'workspace' entries (default: current directory)",
    )
    add(
        "--agent",
        metavar="KEY",
        default=d(""),
        help="session agent preset; '' (default) is the shared layer every agent sees",
    )
    add(
        "--session",
        metavar="ID",
        default=d(None),
        help="session id for writes and snapshots (default: memoryctl-<pid>)",
    )
