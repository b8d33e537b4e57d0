"""What one memoryctl run shares: the exit statuses, the run's context (:class:`Ctx`), the
local checks before any connection (:func:`prepare`), and the one line every failure prints
(:func:`fail`). :mod:`memoryd_client.cli` (the front), :mod:`memoryd_client.commands` and
:mod:`memoryd_client.watching` import it; it imports none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memoryd_protocol.adapters import MARKDOWN_FORMAT, builtin_adapters
from memoryd_protocol.errors import ProtocolError
from memoryd_protocol.paths import default_socket_path

from .autostart import NO_DAEMON_ERRNOS, AutostartFailed, start_daemon
from .colour import painter
from .errors import BadResponse, ClientError, ConnectFailed
from .prompt import Approver
from .render import one_line, to_json

#: a command line, as the parser read it
Args = argparse.Namespace

PROG = "memoryctl"
EXIT_OK, EXIT_PROTOCOL, EXIT_USAGE, EXIT_CONNECTION, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: A canonical entry id (UUID) is 36 characters; a shorter --id is a prefix.
FULL_ID_LENGTH = 36


def _seconds(raw: str) -> float | None:
    """--timeout's value, or None when ``raw`` is not a positive number of seconds."""
    try:
        value = float(raw)
    except ValueError:
        return None
    if not value > 0 or value != value or value == float("inf"):
        return None
    return value


class UsageError(Exception):
    """A local problem with the command line or its input files (exit 2)."""


# --- running ---------------------------------------------------------------------------


class Ctx:
    """One run: the arguments, the socket (as ``str(Path)`` has it), whether stdout is a terminal (``fit``), and what
    :func:`prepare` read (``data``)."""

    #: the approval handler, set by memoryd_client.commands for the verbs that run there
    approver: Approver

    def __init__(self, args: Args, socket: str, fit: bool = False) -> None:
        self.args = args
        self.socket = socket
        self.fit = fit
        self.data: dict[str, Any] = {}

    @property
    def json(self) -> bool:
        return bool(self.args.json)

    def out(self, text: str) -> None:
        if text:
            print(text, flush=True)

    def result(self, value: Any, human: Callable[[], str]) -> None:
        if self.json:
            self.out(to_json(value))
        else:
            self.out(human())


def _read_input(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None


def _text(value: str) -> str:
    if value != "-":
        return value
    text = sys.stdin.read()
    return text[:-1] if text.endswith("\n") else text


def _exists(name: str) -> UsageError:
    return UsageError(f"{name} exists; pass --force to overwrite it")


def _write_private(name: str, text: str, *, force: bool) -> str:
    """Write ``text`` to ``name`` with mode 0600 (memory is personal), atomically: a temp
    file in the same directory, then moved into place, so an existing file readable by
    others is replaced rather than rewritten in place. Without ``force`` an existing
    ``name`` is refused, also one created since the command started (``link`` fails then,
    where a rename would replace it). Returns the path."""
    path = os.path.expanduser(name)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".memoryctl-export-", dir=directory)  # mode 0600
    except OSError as exc:
        raise UsageError(f"cannot write {name}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise _exists(name) from None
            except OSError:  # no hard links on this file system: check, then rename
                if os.path.lexists(path):
                    raise _exists(name) from None
                os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write {name}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return path


_MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown", ".mkd"})
_MARKDOWN_LINE = r"^(#{1,6}[ \t]|[-*+][ \t]+\S)"


def _is_markdown(name: str, raw: str) -> bool:
    return Path(name).suffix.lower() in _MARKDOWN_SUFFIXES or bool(re.search(_MARKDOWN_LINE, raw, re.M))


def _markdown_without_adapter(name: str) -> UsageError:
    """``import NOTES.md`` without ``--adapter``: name the adapters and the command that works."""
    ids = [a.id for a in builtin_adapters().values() if MARKDOWN_FORMAT in a.info().import_formats]
    pick = "hermes-memory-md" if Path(name).name.upper() == "MEMORY.MD" else "claude-code-memory-md"
    shown = "stdin" if name == "-" else name
    return UsageError(
        f"{shown} is markdown, not a memory-export-v1 envelope: import it through an adapter "
        f"({', '.join(ids)}; 'memoryctl adapters' lists all): memoryctl import --adapter {pick} {shlex.quote(name)}"
    )


def prepare(ctx: Ctx) -> None:
    """Everything local (files, stdin, argument checks), before any connection."""
    a = ctx.args
    if a.db:
        ctx.data["db"] = os.path.abspath(os.path.expanduser(a.db))
    if a.verb in ("replace", "remove", "edit"):
        if a.entry_id is not None and a.match is not None:
            raise UsageError(f"{a.verb}: give MATCH or --id, not both")
        if a.verb == "replace" and a.entry_id is None and a.match is None:
            # TEXT is the one positional argparse must fill, so a lone argument lands there:
            # what is missing is the new text after it (or, less likely, MATCH before it).
            raise UsageError(f"replace needs the new TEXT after MATCH: memoryctl replace --track {a.track} "
                             f"--scope {a.scope} MATCH TEXT (or --id ID TEXT)")
        if a.entry_id is None and a.match is None:
            raise UsageError(f"{a.verb} needs MATCH or --id")
    if a.verb == "share" and a.entry_id is not None and a.match is not None:
        raise UsageError("share: give MATCH or --id, not both (or neither, to share every entry of the layer)")
    if getattr(a, "text", None) is not None and a.verb in ("add", "replace", "consolidate"):
        ctx.data["text"] = _text(a.text)
    if a.verb == "export" and a.output and not a.force and os.path.lexists(os.path.expanduser(a.output)):
        raise _exists(a.output)  # before asking the daemon for anything
    if a.verb == "import":
        if a.adapter is None and (a.track or a.scope):
            raise UsageError("import: --track and --scope go with --adapter; an envelope names each entry's "
                             "track and scope")

        raw = _read_input(a.file)
        if a.adapter is None or a.format == "json":
            try:
                ctx.data["payload"] = json.loads(raw)
            except json.JSONDecodeError as exc:
                if a.adapter is None and _is_markdown(a.file, raw):
                    raise _markdown_without_adapter(a.file) from None
                raise UsageError(f"{a.file} is not JSON: {exc}") from None
        else:
            ctx.data["raw"] = raw  # decided with the adapter's import formats (cmd_import)
    if a.verb == "audit":
        if a.action == "accept" and not (a.target or "").isdigit():
            raise UsageError("audit accept needs N: the ledger row that records the change (audit verify names it)")
        if a.action != "list" and a.limit is not None:
            raise UsageError(f"--limit goes with audit list, not audit {a.action}")
        if a.action not in ("verify", "heads") and a.heads is not None:
            raise UsageError(f"--heads goes with audit verify and audit heads, not audit {a.action}")
    if a.verb == "approve" and a.reject and a.yes:
        raise UsageError("approve: --yes and --reject contradict each other")
    for name in ("limit", "count"):
        value = getattr(a, name, None)
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be at least 1")


def _workspace(a: Args) -> str:
    return os.path.abspath(os.path.expanduser(a.workspace)) if a.workspace else os.getcwd()


def _socket(a: Args) -> str:
    """--socket (``~`` expanded), else the default socket, as ``str(Path)`` has them."""
    return str(Path(a.socket).expanduser()) if a.socket else str(default_socket_path())


def _error(ctx: Ctx | None, code: str, message: str, details: dict[str, Any] | None = None) -> None:
    line = " ".join(message.split()) if message else code.lower()
    match = (details or {}).get("match")
    if code in ("ENTRY_NOT_FOUND", "AMBIGUOUS_MATCH") and isinstance(match, str):
        line += f" (match: {one_line(match)})"  # which of several -m failed
    print(f"{painter(sys.stderr)('error:', 'red bold')} {code}: {line}", file=sys.stderr, flush=True)
    if ctx is not None and ctx.json:
        ctx.out(json.dumps({"error": {"code": code, "message": message, "details": details or {}}}, default=str))


def _daemon_reason(tail: str) -> list[str]:
    """What to show of a daemon that exited before it was ready: its own one-line reason
    (``memoryd: STORE_LOCKED: ...``, printed last) when it gave one, else its log tail."""
    lines = tail.splitlines()
    reasons = [line for line in lines if line.startswith("memoryd: ")]
    if reasons:
        return reasons[-1:]
    # the daemon's own lines already carry its "memoryd" prefix
    return [line if line.startswith("memoryd") else f"memoryd: {line}" for line in lines]


def _serve_command(ctx: Ctx) -> str:
    """The ``memoryd serve`` that would serve what this command asked for."""
    a = ctx.args
    cmd = ["memoryd", "serve"]
    if ctx.socket != str(default_socket_path()):
        cmd += ["--socket", ctx.socket]
    if a.db:
        cmd += ["--db", a.db]
    if a.config:
        cmd += ["--config", a.config]
    return shlex.join(cmd)


# --- what several verbs share ----------------------------------------------------------


def only_layer(entries: list[Any], a: Args) -> list[Any]:
    """``memoryctl list --track/--scope``: the entries of that layer."""
    return [e for e in entries if (a.track is None or e.track == a.track) and (a.scope is None or e.scope == a.scope)]


def warn_db(ctx: Ctx, have: str) -> None:
    """--db names another store than the one the daemon serves (``have``, absolute)."""
    want = ctx.data["db"]
    if have != want:
        print(f"warning: the daemon at {ctx.socket} serves {have}, not --db {want}", file=sys.stderr)


def autostart(ctx: Ctx, exc: ConnectFailed, autostarted: bool) -> None:
    """Nothing answered (``exc``): start a daemon on the socket, or re-raise ``exc`` when
    none may be started (--no-autostart, one was started already, or the connect failed
    for another reason than "no daemon there")."""
    a = ctx.args
    if autostarted or a.no_autostart or exc.details.get("errno") not in NO_DAEMON_ERRNOS:
        raise exc
    pid = start_daemon(ctx.socket, db=a.db, config=a.config)
    if pid is not None:
        print(f"memoryctl: started memoryd (pid {pid}) on {ctx.socket}", file=sys.stderr, flush=True)


def fail(ctx: Ctx, exc: Exception) -> int:
    """A failed command's one line on stderr (and ``{"error"}`` with --json), and its exit
    status; ``exc`` itself is re-raised when it is no command failure."""
    a = ctx.args
    if isinstance(exc, UsageError):
        _error(ctx, "USAGE", str(exc))
        return EXIT_USAGE
    if not isinstance(exc, ProtocolError | ClientError):
        raise exc
    message = exc.message
    if isinstance(exc, ProtocolError):
        if exc.code == "WRITE_DENIED" and exc.details.get("outcome") == "unavailable" and a.via_approver:
            message += "; no approver is subscribed: run `memoryctl approve` in another terminal"
    elif isinstance(exc, AutostartFailed):
        for line in _daemon_reason(exc.details.get("stderr") or ""):
            print(line, file=sys.stderr)
    elif isinstance(exc, ConnectFailed) and exc.details.get("errno") in NO_DAEMON_ERRNOS:
        message += f"; no daemon runs there: start one with `{_serve_command(ctx)}`"
        if a.no_autostart:
            message += " or drop --no-autostart"
    _error(ctx, exc.code, message, exc.details)
    # the daemon answered (no, or not in the contract): 1; it was not reached, or not in time: 3
    return EXIT_PROTOCOL if isinstance(exc, ProtocolError | BadResponse) else EXIT_CONNECTION
