"""The daemon's log: one handler on stderr (the journal under systemd), and what reaches it.

Memory text never appears in the log above debug. memoryd's own lines keep to that by what
they log. Another library's lines (the MCP SDK's ``mcp.*``, asyncio's) log what they were
handed: the SDK logs a failing handler's exception, and an exception can quote a request or
a row it could not read. So their records pass :class:`Withheld`, on the handler: every
record reaches it whichever logger it came from, where a filter on the ``mcp`` logger sees
only that logger's own records, never its children's (``mcp.server.runner``).
"""

from __future__ import annotations

import logging
import sys

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


def configure(level: str) -> None:
    """The daemon's one handler, at ``level``, every record passing :class:`Withheld`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(Withheld())
    logging.basicConfig(level=level.upper(), handlers=[handler])
