"""memoryctl's argparse classes, imported only when a command line is parsed with argparse.

memoryctl's read commands read a plain command line without argparse
(:func:`memoryd_client.cli.quick_args`): importing argparse, and building a parser (its
messages go through gettext, which imports locale and looks for translations on disk, and
its parse compiles regular expressions), was a sixth of ``memoryctl query``'s start-up. So
the classes that extend argparse's live here, not in :mod:`memoryd_client.cli`.
"""

from __future__ import annotations

import argparse
import sys

from memoryd_protocol.paths import default_socket

from .cli import EXIT_USAGE, _columns, _global_options, _Partial

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
