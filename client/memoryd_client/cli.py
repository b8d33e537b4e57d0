"""``memoryctl``: manage memoryd from a shell (the reference provider's ``/memory`` verbs).

Exit status: 0 success; 1 the daemon refused (a protocol error such as BUDGET_EXCEEDED or
WRITE_DENIED), or ``audit verify`` found the ledger broken or missing; 2 usage (bad arguments, unreadable input file); 3 no daemon / connection
lost / timeout / autostart failed / stop failed; 130 interrupted. Every error is one line on stderr:
``error: <CODE>: <message>`` (with ``--json``, also ``{"error": {...}}`` on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import textwrap
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import anyio
import msgspec
from memoryd_protocol import types as T
from memoryd_protocol.constants import ALLOWED_ONCE, PROTOCOL, SCOPES, TRACKS
from memoryd_protocol.errors import ProtocolError
from memoryd_protocol.paths import default_socket_path
from memoryd_protocol.text import normalize_agent_key, normalize_workspace_key
from memoryd_protocol.validation import SessionView

from . import render
from .autostart import NO_DAEMON_ERRNOS, AutostartFailed, start_daemon
from .client import DECIDED, Client, __version__, connect, make_session
from .errors import BadResponse, ClientError, ConnectFailed, ConnectionClosed, Timeout
from .prompt import Approver

PROG = "memoryctl"
EXIT_OK, EXIT_PROTOCOL, EXIT_USAGE, EXIT_CONNECTION, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: A canonical entry id (UUID) is 36 characters; a shorter --id is a prefix.
FULL_ID_LENGTH = 36


class UsageError(Exception):
    """A local problem with the command line or its input files (exit 2)."""


class StopFailed(ClientError):
    """``memoryctl stop`` could not stop the daemon or confirm that it stopped (exit 3)."""

    CODE = "STOP_FAILED"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: USAGE: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)


_FORMATTER = argparse.RawDescriptionHelpFormatter



def _positive_seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {raw!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {raw!r}")
    return value

def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The options every verb takes, before or after the verb. On the verbs' parsers the
    defaults are suppressed, so an option given before the verb is not reset after it."""

    def d(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    g = parser.add_argument_group("connection and context (any position)")
    g.add_argument(
        "--socket",
        metavar="PATH",
        default=d(None),
        help=f"daemon socket (default: $MEMORYD_SOCKET, else {default_socket_path()})",
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


def _layer(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument(
        "--track",
        choices=TRACKS,
        required=required,
        help="user: facts about the user; agent: environment facts, conventions, lessons",
    )
    p.add_argument(
        "--scope",
        choices=SCOPES,
        required=required,
        help="user-global: every workspace; workspace: only the session's --workspace",
    )


def _id_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--id",
        dest="entry_id",
        metavar="ID",
        help="the entry's id instead of MATCH: the full id or a unique prefix (as 'memoryctl list' shows it)",
    )


def _text_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("text", metavar="TEXT", help=f"{help} ('-' reads it from stdin)")


def _verb(sub: Any, name: str, summary: str, description: str, examples: str = "") -> argparse.ArgumentParser:
    epilog = "examples:\n" + textwrap.indent(inspect.cleandoc(examples), "  ") if examples else None
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=inspect.cleandoc(description), epilog=epilog, formatter_class=_FORMATTER
    )
    _global_options(p, suppress=True)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        formatter_class=_FORMATTER,
        description=textwrap.dedent("""
            Manage memoryd, the local memory daemon (dsh-memory-protocol v1): read, write,
            audit, import and export memory, and approve writes.

            memoryctl connects to the daemon's socket and starts a daemon there when none
            answers (--no-autostart to disable). Writes under write policy 'ask' show the
            complete change and ask 'Approve? [y/N]' on the terminal; without a terminal
            they are denied unless --yes is given.
        """).strip(),
        epilog=textwrap.dedent("""
            exit status: 0 ok, 1 refused by the daemon (error code on stderr) or a broken
            ledger (audit verify), 2 usage,
            3 no daemon / connection lost / timeout / stop failed, 130 interrupted.
            Run 'memoryctl VERB --help' for a verb's options.
        """).strip(),
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {__version__} ({PROTOCOL})", help="print the version and exit"
    )
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs", parser_class=_Parser)

    p = _verb(
        sub,
        "list",
        "list every entry (all agents and workspaces)",
        """List every memory entry in creation order, across all agents and workspaces
              (the management view). --track/--scope narrow the table.""",
        "memoryctl list\nmemoryctl list --track user --json",
    )
    _layer(p, required=False)

    p = _verb(
        sub,
        "query",
        "search entries by substring",
        """Search entries by case-insensitive substring (ASCII folding). Hits are
              ranked by recall count and recency; each hit's recall count goes up.""",
        "memoryctl query tabs\nmemoryctl query --track agent --limit 50\n"
        "memoryctl query pytest --as-session --workspace ~/proj",
    )
    p.add_argument("text", metavar="TEXT", nargs="?", help="substring to look for (omit to match everything)")
    _layer(p, required=False)
    p.add_argument("--limit", type=int, metavar="N", help="at most N entries (daemon default 20, cap 1000)")
    p.add_argument(
        "--as-session",
        action="store_true",
        help="see only what the session (--workspace, --agent) sees, and audit the recall under --session",
    )

    p = _verb(
        sub,
        "add",
        "add an entry",
        """Add one entry. Under write policy 'ask' the daemon asks for approval first;
              over budget it fails with BUDGET_EXCEEDED (nothing is truncated).""",
        """memoryctl add --track user --scope user-global "Prefers tabs over spaces"
              memoryctl add --track agent --scope workspace --tag ci "Run tests with make check"
              echo "long text" | memoryctl add --track user --scope user-global -""",
    )
    _layer(p)
    p.add_argument("--tag", action="append", default=[], metavar="TAG", help="a tag (repeatable; ≤16, ≤32 chars each)")
    p.add_argument("--source", default="memoryctl", help="provenance label (default: memoryctl)")
    _text_arg(p, "the entry text")

    p = _verb(
        sub,
        "replace",
        "rewrite the one entry that MATCH (or --id) finds",
        """Rewrite exactly one entry, found by a unique case-insensitive substring of its
              text, or by its id (--id, as 'memoryctl list' shows it). The id stays, its
              version goes up. Tags are replaced when --tag is given, kept otherwise. Zero
              hits: ENTRY_NOT_FOUND; several: AMBIGUOUS_MATCH.""",
        'memoryctl replace --track user --scope user-global "tabs" "Prefers 4-space indents"\n'
        'memoryctl replace --track user --scope user-global --id 3f2a1b2c "Prefers 4-space indents"',
    )
    _layer(p)
    p.add_argument("--tag", action="append", metavar="TAG", help="new tags (repeatable); omit to keep the old ones")
    _id_arg(p)
    p.add_argument("match", metavar="MATCH", nargs="?", help="unique substring of the entry to replace (or --id)")
    _text_arg(p, "the new text")

    p = _verb(
        sub,
        "remove",
        "delete the one entry that MATCH (or --id) finds",
        """Delete exactly one entry, found by a unique case-insensitive substring of its
              text, or by its id (--id): the way to remove one of two entries with the same
              text. The approval shows the full text being deleted.""",
        'memoryctl remove --track agent --scope workspace "make check"\n'
        "memoryctl remove --track agent --scope workspace --id 3f2a1b2c",
    )
    _layer(p)
    _id_arg(p)
    p.add_argument("match", metavar="MATCH", nargs="?", help="unique substring of the entry to remove (or --id)")

    p = _verb(
        sub,
        "consolidate",
        "merge several entries into one",
        """Atomically delete every entry found by the -m substrings (1 to 20, each must
              hit exactly one entry) and add one new entry: one approval, one transaction.""",
        'memoryctl consolidate --track user --scope user-global -m tabs -m indent "Prefers 4-space indents"',
    )
    _layer(p)
    p.add_argument(
        "-m",
        "--match",
        dest="matches",
        action="append",
        required=True,
        metavar="MATCH",
        help="unique substring of an entry to merge (repeat for each, 1..20)",
    )
    p.add_argument("--tag", action="append", metavar="TAG", help="tags of the new entry (repeatable)")
    _text_arg(p, "the merged entry's text")

    _verb(
        sub,
        "budgets",
        "show budget use per track and scope",
        """Characters used and allowed per track × scope (UTF-16 code units, as the
          protocol counts them), over the whole store.""",
        "memoryctl budgets",
    )

    p = _verb(
        sub,
        "audit",
        "show the audit ledger; verify its hash chain; explain one entry's life",
        """The audit ledger: every write, denial, recall and snapshot, newest first.

              'audit verify' checks the ledger's hash chain, that every audit row since the
              chain's start is in it unchanged, and that replaying it gives the live entries;
              exit 1 on any break, naming the first bad row. 'audit explain TEXT|ID' tells one
              entry's life: every write, who asked, who approved and how, and which sessions'
              snapshots showed it.

              verify and explain ask the daemon; with --db PATH they read that store
              themselves, read-only, without a daemon (refused while a daemon holds it).""",
        "memoryctl audit --limit 20\nmemoryctl audit verify\nmemoryctl audit verify --db ~/backup/memory.db\n"
        'memoryctl audit explain "Prefers tabs"\nmemoryctl audit explain 3f2a1b2c-5d6e-4f70-8a9b-0c1d2e3f4a5b',
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("list", "verify", "explain"),
        default="list",
        help="list (default), verify or explain",
    )
    p.add_argument("target", nargs="?", metavar="TEXT|ID",
                   help="explain: an entry's id, or a text that exactly one entry contains")
    p.add_argument("--limit", type=int, metavar="N", help="list: at most N rows (default 100)")

    p = _verb(
        sub,
        "proposals",
        "list, approve or dismiss memory proposals",
        """Pending memory suggestions (for example from a compaction summary).
              'approve ID' writes the proposal through the normal write pipeline (approval,
              budget, audit); 'dismiss ID' drops it. ID may be a unique prefix.""",
        "memoryctl proposals\nmemoryctl proposals --status dismissed\n"
        "memoryctl proposals approve 3f2a\nmemoryctl proposals dismiss 3f2a",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("list", "approve", "dismiss"),
        default="list",
        help="list (default), approve or dismiss",
    )
    p.add_argument("id", nargs="?", metavar="ID", help="proposal id (or unique prefix) to approve or dismiss")
    p.add_argument("--status", choices=("pending", "approved", "dismissed"), help="list only proposals in this state")

    p = _verb(
        sub,
        "export",
        "write every entry as JSON (or an adapter's format)",
        """Print the memory-export-v1 envelope (a complete backup), or with --adapter the
              adapter's document (e.g. markdown). Read-only: no approval, no audit row.""",
        "memoryctl export > memory.json\nmemoryctl export --adapter claude-code-memory-md -o CLAUDE.md\n"
        "memoryctl export -o memory.json --force   # replace yesterday's backup",
    )
    p.add_argument("--adapter", metavar="ID", help="export through this adapter (see 'memoryctl adapters')")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (mode 0600) instead of stdout")
    p.add_argument("--force", action="store_true", help="let -o replace an existing FILE (refused otherwise)")

    p = _verb(
        sub,
        "import",
        "import an export envelope or an adapter's file",
        """Import entries through seed: one approval for the whole batch, a budget check
              of the whole batch, one transaction. Without --adapter FILE must be a
              memory-export-v1 envelope; with --adapter it is that adapter's format (JSON or
              text, detected; --format to force). Entries that already exist (same track,
              scope, workspace, agent and text) are skipped, so importing the same backup
              or CLAUDE.md again changes nothing; --allow-duplicates imports them anyway.""",
        "memoryctl import memory.json\nmemoryctl import --adapter claude-code-memory-md CLAUDE.md\n"
        "memoryctl import --adapter mem0 - < facts.json",
    )
    p.add_argument("--adapter", metavar="ID", help="convert FILE with this adapter (see 'memoryctl adapters')")
    p.add_argument(
        "--allow-duplicates",
        action="store_true",
        help="also import entries that already exist (same layer, keys and text); by default they are skipped",
    )
    p.add_argument(
        "--format",
        choices=("auto", "json", "text"),
        default="auto",
        help="adapter payload: parsed JSON or the raw text (default auto: JSON if it parses)",
    )
    p.add_argument("file", metavar="FILE", help="file to import ('-' reads stdin)")

    _verb(
        sub,
        "adapters",
        "list the import/export adapters",
        """The adapters the daemon knows (mem0, hermes-memory-md, claude-code-memory-md, and
          any installed plugin adapters).""",
        "memoryctl adapters",
    )

    _verb(
        sub,
        "status",
        "show the daemon's status",
        """The daemon's socket, pid, version, uptime and write policy; its store (path and
          schema), config file and log file; its connections, pending approvals and write
          queue depth. --json prints the daemon/status result (the wire shape).""",
        "memoryctl status\nmemoryctl status --json",
    )

    _verb(
        sub,
        "stop",
        "stop the daemon and wait until it is gone",
        """Stop the daemon on the socket cleanly (SIGTERM): it stops accepting, cancels
          pending approvals, lets in-flight writes finish, removes its socket and exits.
          Returns once the socket is gone and the process has exited (the store is free).
          Never starts a daemon; when none runs it says so and exits 0.""",
        "memoryctl stop\nmemoryctl stop --socket /tmp/memoryd-test.sock",
    )

    p = _verb(
        sub,
        "snapshot",
        "print the memory snapshot a session sees",
        """Print the frozen memory block injected into a session's system prompt: what a
              session with this --session id, --workspace (--cwd) and --agent sees. Rendered
              once per session id, then frozen; the default id is new each run, so the
              default shows what a new session would see now.""",
        "memoryctl snapshot\nmemoryctl snapshot --session s-42 --cwd ~/proj --agent coder",
    )
    p.add_argument("--lang", choices=("en", "zh"), help="snapshot language (default: the daemon's)")

    p = _verb(
        sub,
        "approve",
        "answer approvals for other clients' writes",
        """Become an approver: writes from clients that cannot approve themselves (a
              headless agent, a script) are asked here, one at a time, with their complete
              payload. Prints a notice when another approver decided first. Runs until
              Ctrl-C or end of input.""",
        "memoryctl approve\nmemoryctl approve --reject   # deny everything, e.g. while away",
    )
    p.add_argument("--reject", action="store_true", help="reject every approval without asking")
    p.add_argument("--count", type=int, metavar="N", help="exit after N decisions")

    _verb(
        sub,
        "socket",
        "print the socket path memoryctl uses (no daemon contact)",
        """Print the absolute path of the daemon socket memoryctl connects to: --socket,
          else $MEMORYD_SOCKET, else the per-user default. Contacts no daemon and starts
          none, so it also works before one runs. --json prints {"socket": PATH}.""",
        'socat - UNIX-CONNECT:"$(memoryctl socket)"\nmemoryctl --socket /tmp/m.sock socket',
    )
    return parser


def verbs(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """Verb name → its parser (for docs and tests)."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


# --- running ---------------------------------------------------------------------------


@dataclass
class Ctx:
    args: argparse.Namespace
    socket: Path
    approver: Approver
    fit: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def json(self) -> bool:
        return bool(self.args.json)

    def out(self, text: str) -> None:
        if text:
            print(text, flush=True)

    def result(self, value: Any, human: Callable[[], str]) -> None:
        self.out(render.to_json(value) if self.json else human())


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
_MARKDOWN_LINE = re.compile(r"^(#{1,6}[ \t]|[-*+][ \t]+\S)", re.M)


def _is_markdown(name: str, raw: str) -> bool:
    return Path(name).suffix.lower() in _MARKDOWN_SUFFIXES or bool(_MARKDOWN_LINE.search(raw))


def _markdown_without_adapter(name: str) -> UsageError:
    """``import NOTES.md`` without ``--adapter``: name the adapters and the command that works."""
    from memoryd_protocol.adapters import MARKDOWN_FORMAT, builtin_adapters

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
    if getattr(a, "text", None) is not None and a.verb in ("add", "replace", "consolidate"):
        ctx.data["text"] = _text(a.text)
    if a.verb in ("replace", "remove"):
        if a.entry_id is not None and a.match is not None:
            raise UsageError(f"{a.verb}: give MATCH or --id, not both")
        if a.entry_id is None and a.match is None:
            raise UsageError(f"{a.verb} needs MATCH or --id")
    if a.verb == "proposals" and a.action != "list" and not a.id:
        raise UsageError(f"proposals {a.action} needs an ID")
    if a.verb == "proposals" and a.action == "list" and a.id:
        raise UsageError("proposals: an ID goes with approve or dismiss")
    if a.verb == "export" and a.output and not a.force and os.path.lexists(os.path.expanduser(a.output)):
        raise _exists(a.output)  # before asking the daemon for anything
    if a.verb == "import":
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
        if a.action == "explain" and not a.target:
            raise UsageError("audit explain needs TEXT or ID: the entry's id, or a text that one entry contains")
        if a.action != "explain" and a.target is not None:
            raise UsageError(f"audit {a.action} takes no TEXT|ID (only audit explain does)")
        if a.action != "list" and a.limit is not None:
            raise UsageError(f"--limit goes with audit list, not audit {a.action}")
    if a.verb == "approve" and a.reject and a.yes:
        raise UsageError("approve: --yes and --reject contradict each other")
    for name in ("limit", "count"):
        value = getattr(a, name, None)
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be at least 1")


async def cmd_list(c: Client, ctx: Ctx) -> None:
    a = ctx.args
    entries = [
        e for e in await c.list() if (a.track is None or e.track == a.track) and (a.scope is None or e.scope == a.scope)
    ]
    ctx.result(entries, lambda: render.entries_table(entries, fit=ctx.fit) if entries else "no entries")


async def cmd_query(c: Client, ctx: Ctx) -> None:
    a = ctx.args
    flt = {
        k: v for k, v in (("text", a.text), ("track", a.track), ("scope", a.scope), ("limit", a.limit)) if v is not None
    }
    opts = None
    if a.as_session:
        opts = {"sessionId": c.session["id"] if c.session else None, "agentKey": a.agent, "workspaceKey": _workspace(a)}
    r = await c.query(flt or None, opts)

    def human() -> str:
        if not r.entries:
            return "no matches"
        more = " (truncated; --limit N for more)" if r.truncated else ""
        return f"{render.entries_table(r.entries, fit=ctx.fit)}\n{len(r.entries)} of {r.total} matches{more}"

    ctx.result(r, human)


def _input(ctx: Ctx, **extra: Any) -> dict[str, Any]:
    a = ctx.args
    inp: dict[str, Any] = {"track": a.track, "scope": a.scope, **extra}
    if "text" in ctx.data:
        inp["text"] = ctx.data["text"]
    tags = getattr(a, "tag", None)
    if tags:
        inp["tags"] = tags
    return inp


async def cmd_add(c: Client, ctx: Ctx) -> None:
    r = await c.add(_input(ctx, source=ctx.args.source))
    ctx.result(r, lambda: f"added {render.short(r.entry.id)} ({render.usage(r.usage)})")


async def _target(c: Client, ctx: Ctx) -> dict[str, str]:
    """``{match}`` or ``{id}``; an --id shorter than a full id is widened to the one entry of
    this track/scope, visible to the session, whose id starts with it."""
    a = ctx.args
    if a.entry_id is None:
        return {"match": a.match}
    prefix: str = a.entry_id
    if len(prefix) >= FULL_ID_LENGTH or not prefix:
        return {"id": prefix}
    view = SessionView(None, normalize_workspace_key(_workspace(a)), normalize_agent_key(a.agent))
    hits = [
        e.id
        for e in await c.list()
        if e.track == a.track
        and e.scope == a.scope
        and e.id.startswith(prefix)
        and view.sees(e.scope, e.workspace_key, e.agent_key)
    ]
    if len(hits) > 1:
        raise UsageError(f"--id {prefix} starts {len(hits)} entries' ids in {a.track}/{a.scope}; give more of it")
    return {"id": hits[0] if hits else prefix}  # none: the daemon answers ENTRY_NOT_FOUND


async def cmd_replace(c: Client, ctx: Ctx) -> None:
    r = await c.replace(_input(ctx, **await _target(c, ctx)))
    ctx.result(
        r, lambda: f"replaced {render.short(r.entry.id)}, now version {r.entry.version} ({render.usage(r.usage)})"
    )


async def cmd_remove(c: Client, ctx: Ctx) -> None:
    r = await c.remove(_input(ctx, **await _target(c, ctx)))
    ctx.result(r, lambda: f"removed {render.short(r.entry.id)} ({render.usage(r.usage)})")


async def cmd_consolidate(c: Client, ctx: Ctx) -> None:
    r = await c.consolidate(_input(ctx, matches=ctx.args.matches))
    ctx.result(
        r, lambda: f"consolidated {len(r.removed)} entries into {render.short(r.entry.id)} ({render.usage(r.usage)})"
    )


async def cmd_budgets(c: Client, ctx: Ctx) -> None:
    rows = await c.budgets()
    ctx.result(rows, lambda: render.budgets_table(rows))


def _ledger_report(ctx: Ctx, report: T.LedgerReport) -> int:
    ctx.result(report, lambda: render.ledger_report(report))
    return EXIT_OK if report.ok else EXIT_PROTOCOL


def _entry_life(ctx: Ctx, life: T.EntryLife) -> int:
    ctx.result(life, lambda: render.entry_life(life))
    return EXIT_OK


async def cmd_audit(c: Client, ctx: Ctx) -> int:
    a = ctx.args
    if a.action == "verify":
        return _ledger_report(ctx, await c.audit_verify())
    if a.action == "explain":
        return _entry_life(ctx, await c.audit_explain(a.target))
    rows = await c.audit_list(a.limit)
    ctx.result(rows, lambda: render.audit_table(rows, fit=ctx.fit) if rows else "no audit rows")
    return EXIT_OK


def audit_offline(ctx: Ctx) -> int:
    """``audit verify|explain --db PATH``: read the store itself, read-only, no daemon."""
    from memoryd_protocol.ledger import read_life, read_report

    from . import offline

    a, db = ctx.args, ctx.data["db"]
    try:
        if a.action == "verify":
            return _ledger_report(ctx, offline.read(db, read_report))
        target: str = a.target
        return _entry_life(ctx, offline.read(db, lambda fetch: read_life(fetch, target)))
    except offline.StoreHeld as exc:
        how = "run it without --db"
        if exc.socket is not None and Path(exc.socket) != ctx.socket:
            how += f" and with --socket {shlex.quote(exc.socket)}"
        raise UsageError(f"{exc}: ask that daemon instead, {how}") from None
    except offline.OfflineError as exc:
        raise UsageError(str(exc)) from None
    except offline.NoLedger as exc:
        _error(ctx, "NO_LEDGER", f"{exc} ({db}); its chain begins when memoryd first opens it", {"path": db})
        return EXIT_PROTOCOL


async def _proposal_id(c: Client, prefix: str) -> str:
    if len(prefix) >= 32:
        return prefix
    hits = [p.id for p in await c.proposals_list("pending") if p.id.startswith(prefix)]
    if len(hits) == 1:
        return hits[0]
    return prefix  # zero or several: let the daemon say PROPOSAL_NOT_FOUND


async def cmd_proposals(c: Client, ctx: Ctx) -> None:
    a = ctx.args
    if a.action == "list":
        rows = await c.proposals_list(a.status)
        ctx.result(rows, lambda: render.proposals_table(rows, fit=ctx.fit) if rows else "no proposals")
    elif a.action == "approve":
        r = await c.proposals_approve(await _proposal_id(c, a.id))
        ctx.result(
            r, lambda: f"approved proposal {r.proposal.id}: added {render.short(r.entry.id)} ({render.usage(r.usage)})"
        )
    else:
        p = await c.proposals_dismiss(await _proposal_id(c, a.id))
        ctx.result(p, lambda: f"dismissed proposal {p.id}")


async def cmd_export(c: Client, ctx: Ctx) -> None:
    doc = await c.export(ctx.args.adapter)
    text = doc if isinstance(doc, str) else render.to_json(doc)
    if not text.endswith("\n"):
        text += "\n"
    if ctx.args.output:
        path = await anyio.to_thread.run_sync(partial(_write_private, ctx.args.output, text, force=ctx.args.force))
        if not ctx.json:
            print(f"exported to {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def _parse_json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return None


async def _adapter_payload(c: Client, ctx: Ctx) -> Any:
    """The payload for ``--adapter``: parsed JSON for a JSON adapter, the text for a text one
    (``importFormats`` says which); the raw text when JSON does not parse."""
    a = ctx.args
    if "payload" in ctx.data:
        return ctx.data["payload"]
    raw: str = ctx.data["raw"]
    if a.format == "text":
        return raw
    formats = next((ad.import_formats for ad in await c.adapters_list() if ad.id == a.adapter), [])
    wants_json = any("json" in f for f in formats)
    wants_text = any(f.startswith("text/") for f in formats)
    if wants_text and not wants_json:
        return raw
    parsed = _parse_json(raw)
    return parsed if isinstance(parsed, dict | list) else raw


async def cmd_import(c: Client, ctx: Ctx) -> None:
    a = ctx.args
    skip = None if a.allow_duplicates else True
    if a.adapter:
        r = await c.import_(adapter=a.adapter, payload=await _adapter_payload(c, ctx), skip_existing=skip)
    else:
        r = await c.import_(envelope=ctx.data["payload"], skip_existing=skip)

    def human() -> str:
        if isinstance(r.skipped, msgspec.UnsetType):
            return f"imported {r.added} entries"
        return f"imported {r.added} entries, skipped {r.skipped} already in the store"

    ctx.result(r, human)


async def cmd_adapters(c: Client, ctx: Ctx) -> None:
    rows = await c.adapters_list()
    ctx.result(rows, lambda: render.adapters_table(rows, fit=ctx.fit))


async def cmd_status(c: Client, ctx: Ctx) -> None:
    s = await c.status()
    ctx.result(s, lambda: render.status_lines(s, socket=str(ctx.socket)))


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux ≥ 5.3): signal it without a pid-reuse race, and wait for
    its exit. None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _terminate(pid: int, pidfd: int | None) -> None:
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # exiting already: its connection ends all the same
    except OSError as exc:
        raise StopFailed(f"cannot signal memoryd (pid {pid}): {exc.strerror or exc}", {"pid": pid}) from None


def _present(path: str) -> bool:
    return os.path.lexists(path)


def _not_running(ctx: Ctx) -> None:
    where = str(ctx.socket)
    ctx.result({"stopped": False, "pid": None, "socket": where}, lambda: f"memoryd is not running on {where}")


async def cmd_stop(c: Client, ctx: Ctx) -> None:
    """SIGTERM the daemon, then wait on what it does as it finishes draining: it unlinks its
    socket and closes every connection (EOF on this one), then exits (its pidfd turns
    readable). No polling."""
    s = await c.status()
    pid, peer = s.pid, c.peer_pid
    if peer is not None and peer != pid:  # another pid namespace, or something in between
        raise StopFailed(
            f"the daemon at {ctx.socket} reports pid {pid} but the socket's peer is pid {peer}; not signalling",
            {"pid": pid, "peerPid": peer},
        )
    pidfd = _pidfd(pid)
    try:
        _terminate(pid, pidfd)
        with anyio.move_on_after(ctx.args.timeout) as waiting:
            await c.wait_closed()
            if s.socket is not None and _present(s.socket):
                raise StopFailed(
                    f"memoryd (pid {pid}) closed its connections but {s.socket} is still there", {"pid": pid}
                )
            if pidfd is not None:
                await anyio.wait_readable(pidfd)
        if waiting.cancelled_caught:
            raise Timeout(f"memoryd (pid {pid}) did not stop within {ctx.args.timeout:g}s", {"pid": pid})
    finally:
        if pidfd is not None:
            os.close(pidfd)
    where = s.socket if s.socket is not None else str(ctx.socket)
    note = "" if s.socket is not None else " (systemd keeps the socket and starts memoryd on the next connection)"
    ctx.result({"stopped": True, "pid": pid, "socket": where}, lambda: f"stopped memoryd (pid {pid}) on {where}{note}")


async def cmd_snapshot(c: Client, ctx: Ctx) -> None:
    r = await c.snapshot(c.session, ctx.args.lang)
    if ctx.json:
        ctx.out(render.to_json(r))
    elif r.text:
        sys.stdout.write(render.visible(r.text) if ctx.fit else r.text)
        sys.stdout.write("\n" if not r.text.endswith("\n") else "")
        sys.stdout.flush()
    else:
        print("(empty snapshot: no entries visible to this session)", file=sys.stderr)


async def cmd_approve(c: Client, ctx: Ctx) -> int:
    a = ctx.args
    events = c.events("approval/resolved", DECIDED)
    await c.approval_subscribe()
    print(f"memoryctl: approving writes for memoryd at {ctx.socket} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    decided = 0
    async for ev in events:
        p = ev.params
        if ev.method == DECIDED:
            decided += 1
            word = "approved" if p.outcome == ALLOWED_ONCE else p.outcome
            late = f" (too late: {p.refused})" if p.refused else ""
            if ctx.json:
                ctx.out(json.dumps({"id": p.id, "outcome": p.outcome, "refused": p.refused}))
            else:
                ctx.out(f"{word} {p.id}{late}")
            if (a.count and decided >= a.count) or ctx.approver.eof:
                return EXIT_OK
        else:
            rid, outcome = (p.id, p.outcome) if isinstance(p, T.ApprovalResolved) else (p.get("id"), p.get("outcome"))
            if ctx.json:
                ctx.out(json.dumps({"id": rid, "outcome": outcome, "resolvedElsewhere": True}))
            else:
                ctx.out(f"approval {rid} was decided by another approver: {outcome}")
    raise ConnectionClosed("the daemon closed the connection")


COMMANDS: dict[str, Callable[[Client, Ctx], Awaitable[Any]]] = {
    "list": cmd_list,
    "query": cmd_query,
    "add": cmd_add,
    "replace": cmd_replace,
    "remove": cmd_remove,
    "consolidate": cmd_consolidate,
    "budgets": cmd_budgets,
    "audit": cmd_audit,
    "proposals": cmd_proposals,
    "export": cmd_export,
    "import": cmd_import,
    "adapters": cmd_adapters,
    "status": cmd_status,
    "stop": cmd_stop,
    "snapshot": cmd_snapshot,
    "approve": cmd_approve,
}


def _workspace(a: argparse.Namespace) -> str:
    return os.path.abspath(os.path.expanduser(a.workspace)) if a.workspace else os.getcwd()


def _socket(a: argparse.Namespace) -> Path:
    return Path(a.socket).expanduser() if a.socket else default_socket_path()


def _error(ctx: Ctx | None, code: str, message: str, details: dict[str, Any] | None = None) -> None:
    line = " ".join(message.split()) if message else code.lower()
    match = (details or {}).get("match")
    if code in ("ENTRY_NOT_FOUND", "AMBIGUOUS_MATCH") and isinstance(match, str):
        line += f" (match: {render.one_line(match)})"  # which of several -m failed
    print(f"error: {code}: {line}", file=sys.stderr, flush=True)
    if ctx is not None and ctx.json:
        ctx.out(json.dumps({"error": {"code": code, "message": message, "details": details or {}}}, default=str))


async def _warn_db(c: Client, ctx: Ctx) -> None:
    want = ctx.data["db"]
    try:
        have = (await c.status()).store.path
    except (ProtocolError, ClientError):
        return
    if have != want:  # the daemon reports an absolute path
        print(f"warning: the daemon at {ctx.socket} serves {have}, not --db {want}", file=sys.stderr)


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
    if ctx.socket != default_socket_path():
        cmd += ["--socket", str(ctx.socket)]
    if a.db:
        cmd += ["--db", a.db]
    if a.config:
        cmd += ["--config", a.config]
    return shlex.join(cmd)


async def run(ctx: Ctx) -> int:
    a = ctx.args
    session = make_session(a.session or f"memoryctl-{os.getpid()}", cwd=_workspace(a), agent_preset=a.agent)
    command = COMMANDS[a.verb]
    autostarted = False
    try:
        prepare(ctx)
        if a.verb == "audit" and a.action != "list" and a.db:
            return audit_offline(ctx)  # the store itself, read-only: no connection, no autostart
        while True:
            try:
                async with connect(
                    ctx.socket,
                    session=session,
                    # --via-approver: this connection declares it cannot approve, so the
                    # daemon routes its writes to subscribed approvers (wire-v1 §5).
                    approvals=not (a.via_approver and a.verb != "approve"),
                    on_approval=ctx.approver,
                    client_name=PROG,
                    timeout=a.timeout,
                ) as c:
                    if a.db and not autostarted:
                        await _warn_db(c, ctx)
                    code = await command(c, ctx)
                    return code if isinstance(code, int) else EXIT_OK
            except ConnectFailed as exc:
                no_daemon = exc.details.get("errno") in NO_DAEMON_ERRNOS
                if a.verb == "stop" and no_daemon:  # nothing to stop is not an error; never autostart
                    _not_running(ctx)
                    return EXIT_OK
                if autostarted or a.no_autostart or not no_daemon:
                    raise
            autostarted = True
            pid = await anyio.to_thread.run_sync(partial(start_daemon, ctx.socket, db=a.db, config=a.config))
            if pid is not None:
                print(f"memoryctl: started memoryd (pid {pid}) on {ctx.socket}", file=sys.stderr, flush=True)
    except UsageError as exc:
        _error(ctx, "USAGE", str(exc))
        return EXIT_USAGE
    except ProtocolError as exc:
        message = exc.message
        if exc.code == "WRITE_DENIED" and exc.details.get("outcome") == "unavailable" and a.via_approver:
            message += "; no approver is subscribed: run `memoryctl approve` in another terminal"
        _error(ctx, exc.code, message, exc.details)
        return EXIT_PROTOCOL
    except AutostartFailed as exc:
        for line in _daemon_reason(exc.details.get("stderr") or ""):
            print(line, file=sys.stderr)
        _error(ctx, exc.code, exc.message, exc.details)
        return EXIT_CONNECTION
    except ConnectFailed as exc:
        message = exc.message
        if exc.details.get("errno") in NO_DAEMON_ERRNOS:
            message += f"; no daemon runs there: start one with `{_serve_command(ctx)}`"
            if a.no_autostart:
                message += " or drop --no-autostart"
        _error(ctx, exc.code, message, exc.details)
        return EXIT_CONNECTION
    except BadResponse as exc:
        _error(ctx, exc.code, exc.message, exc.details)
        return EXIT_PROTOCOL
    except ClientError as exc:
        _error(ctx, exc.code, exc.message, exc.details)
        return EXIT_CONNECTION
    finally:
        ctx.approver.close()


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parse_args``, except that ``audit explain --db PATH TEXT`` works too: argparse fills
    a verb's optional positionals from the words before the first option only, so a TEXT
    after an option is left over; it is taken as the TEXT when nothing else is."""
    args, extras = parser.parse_known_args(argv)
    if (len(extras) == 1 and not extras[0].startswith("-") and getattr(args, "verb", None) == "audit"
            and args.action == "explain" and args.target is None):
        args.target, extras = extras[0], []
    if extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not args.verb:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    ctx = Ctx(
        args=args,
        socket=_socket(args),
        approver=Approver(yes=args.yes, reject=getattr(args, "reject", False)),
        fit=_isatty(sys.stdout),
    )
    if args.verb == "socket":  # local only: no connection, no autostart
        path = str(ctx.socket.absolute())
        ctx.out(json.dumps({"socket": path}) if ctx.json else path)
        return EXIT_OK
    try:
        return anyio.run(run, ctx)
    except BrokenPipeError:  # `memoryctl list | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        if args.verb == "approve":
            print("", file=sys.stderr)
            return EXIT_OK
        _error(None, "INTERRUPTED", "interrupted")
        return EXIT_INTERRUPTED


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
