"""The daemon's log: one handler on stderr (the journal under systemd), and what reaches it.

Memory text never appears in the log above debug. memoryd's own lines keep to that by what
they log. Another library's lines (the MCP SDK's ``mcp.*``, asyncio's) log what they were
handed: the SDK logs a failing handler's exception, and an exception can quote a request or
a row it could not read. So their records pass :class:`Withheld`, on the handler: every
record reaches it whichever logger it came from, where a filter on the ``mcp`` logger sees
only that logger's own records, never its children's (``mcp.server.runner``). And any
record's traceback, memoryd's own included, keeps its frames but not the exception's
message: sqlite's error for a row it cannot decode quotes the row's text.
"""

from __future__ import annotations

import logging
import sys
import traceback
from types import TracebackType

#: memoryd's loggers: ``memoryd`` and below it
OWN = "memoryd"
FORMAT = "%(asctime)s memoryd[%(process)d] %(levelname)s %(name)s: %(message)s"


class Withheld(logging.Filter):
    """Another library's log lines without their arguments, which can hold memory text:
    only warnings and errors, with the exception's type, unless memoryd logs at debug.
    memoryd's own lines pass as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == OWN or record.name.startswith(f"{OWN}."):
            return True
        if logging.getLogger(OWN).isEnabledFor(logging.DEBUG):
            return True
        if record.levelno < logging.WARNING:
            return False
        text = str(record.msg)
        if record.args:
            try:
                text = text % tuple("…" for _ in (record.args if isinstance(record.args, tuple) else (0,)))
            except (TypeError, ValueError):
                pass
        if record.exc_info and record.exc_info[0] is not None:
            text += f" ({record.exc_info[0].__name__}; memoryd's debug log has the details)"
        record.msg, record.args, record.exc_info, record.exc_text, record.stack_info = text, (), None, None, None
        return True


def _frames(exc: BaseException, seen: set[int]) -> list[str]:
    """``exc``'s traceback as Python prints it, each exception of the chain with its type in
    place of its message."""
    seen.add(id(exc))
    out: list[str] = []
    cause, context = exc.__cause__, None if exc.__suppress_context__ else exc.__context__
    if cause is not None and id(cause) not in seen:
        out += [*_frames(cause, seen), "\nThe above exception was the direct cause of the following exception:\n\n"]
    elif context is not None and id(context) not in seen:
        out += [*_frames(context, seen), "\nDuring handling of the above exception, another exception occurred:\n\n"]
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return [*out, "Traceback (most recent call last):\n", *traceback.format_tb(exc.__traceback__),
            f"{name} (its message withheld: memoryd's debug log has it)\n"]


class Formatter(logging.Formatter):
    """The daemon's lines: a traceback without the exceptions' messages unless memoryd logs
    at debug."""

    def formatException(self, ei: tuple[type[BaseException], BaseException, TracebackType | None]
                        | tuple[None, None, None]) -> str:
        if ei[1] is None or logging.getLogger(OWN).isEnabledFor(logging.DEBUG):
            return super().formatException(ei)
        return "".join(_frames(ei[1], set())).rstrip("\n")


def configure(level: str) -> None:
    """The daemon's one handler, at ``level``, every record passing :class:`Withheld`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Formatter(FORMAT))
    handler.addFilter(Withheld())
    logging.basicConfig(level=level.upper(), handlers=[handler])
