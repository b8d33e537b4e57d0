"""``memoryctl``: manage memoryd from a shell (the reference provider's ``/memory`` verbs).

Exit status: 0 success; 1 the daemon refused (a protocol error such as BUDGET_EXCEEDED or
WRITE_DENIED), or ``audit verify`` found the ledger broken or missing; 2 usage (bad arguments, unreadable input file); 3 no daemon / connection
lost / timeout / autostart failed / stop failed; 130 interrupted. Every error is one line on stderr:
``error: <CODE>: <message>`` (with ``--json``, also ``{"error": {...}}`` on stdout).
"""

from __future__ import annotations

import os
import sys

from memoryd_protocol import __version__
from memoryd_protocol.constants import PROTOCOL, SCOPES, TRACKS

from .quick import LEAN_VERBS, quick_args, run_quick
from .running import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, PROG, Ctx, _error, _Partial, _socket

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from types import SimpleNamespace
    from typing import Any

    from .parsing import Parser

    #: a command line read: by argparse, or by quick_args (a read command's plain one)
    Args = argparse.Namespace | SimpleNamespace

# This module is memoryctl's front: the command line and the exit statuses. A plain read
# command takes the quick path (memoryd_client.quick); every other verb runs in
# memoryd_client.commands, imported only then; argparse and the parser classes
# (memoryd_client.parsing) are imported only when a command line is not a plain read
# command's.

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


def cleandoc(text: str) -> str:
    """``inspect.cleandoc``, the same steps, without importing ``inspect`` or ``textwrap``:
    with ``dataclasses`` they were a tenth of memoryctl's start-up (``textwrap`` compiles its
    regular expressions at import; argparse imports it only to print help).
    tests/test_cli_quick.py checks that both agree on every help text here."""
    lines = text.expandtabs().split("\n")
    margins = [len(line) - len(line.lstrip()) for line in lines[1:] if line.lstrip()]
    margin = min(margins, default=0)
    lines = [lines[0].lstrip(), *(line[margin:] for line in lines[1:])]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines)


def _indent(text: str, prefix: str) -> str:
    """``textwrap.indent`` for these help texts (lines that are not blank get ``prefix``)."""
    return "\n".join(prefix + line if line.strip() else line for line in text.split("\n"))


def _verb(sub: _Only, name: str, summary: str, description: str, examples: str = "",
          arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    if not sub.wants(name):
        return
    from .parsing import FORMATTER

    epilog = "examples:\n" + _indent(cleandoc(examples), "  ") if examples else None
    sub.add_parser(name, help=summary, description=cleandoc(description), epilog=epilog, formatter_class=FORMATTER,
                   arguments=arguments)


class _Only:
    """``add_subparsers()``'s ``add_parser`` for the verbs in ``names`` only (None: all);
    without ``global_options`` their parsers leave out the global options (no option word
    follows a verb in argv, so none can be given after it)."""

    def __init__(self, sub: Any, names: frozenset[str] | None, global_options: bool,
                 made: dict[str, Any]) -> None:
        self.sub, self.names, self.global_options, self.made = sub, names, global_options, made

    def wants(self, name: str) -> bool:
        return self.names is None or name in self.names

    def add_parser(self, name: str, **kwargs: Any) -> None:
        self.made[name] = self.sub.add_parser(name, partial=self.names is not None,
                                              global_options=self.global_options, **kwargs)


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


#: Every verb, in the order --help lists them (test_cli_quick checks it against build_parser()).
VERB_NAMES = ("list", "query", "add", "replace", "remove", "consolidate", "budgets", "audit", "proposals", "export",
              "import", "adapters", "status", "stop", "snapshot", "approve", "watch", "socket", "rpc")


def build_parser(argv: Sequence[str] | None = None) -> Parser:
    """memoryctl's parser. With ``argv``, only the verbs it can be running get their parser
    (:func:`_named_verbs`): building seventeen of them, each with a dozen options, was most of
    memoryctl's start-up. Such a parser raises :class:`_Partial` instead of printing an
    error, since the message may list the verbs (:func:`main` parses again with them all)."""
    from .parsing import FORMATTER, Parser, Verb, _global_options

    only = None if argv is None else _named_verbs(argv)
    # A verb's parser without the dozen global options when no option follows a verb: the
    # same Namespace (their defaults are suppressed there), a millisecond less.
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
    sub = _Only(parser.add_subparsers(dest="verb", metavar="VERB", title="verbs", parser_class=Verb), only,
                globals_on_verbs, parser.verb_parsers)

    def _list_args(p: argparse.ArgumentParser) -> None:
        _layer(p, required=False)

    _verb(
        sub,
        "list",
        "list every entry (all agents and workspaces)",
        """List every memory entry in creation order, across all agents and workspaces
              (the management view). --track/--scope narrow the table.""",
        "memoryctl list\nmemoryctl list --track user --json",
        arguments=_list_args,
    )

    def _query_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("text", metavar="TEXT", nargs="?", help="substring to look for (omit to match everything)")
        _layer(p, required=False)
        p.add_argument("--limit", type=int, metavar="N", help="at most N entries (daemon default 20, cap 1000)")
        p.add_argument(
            "--as-session",
            action="store_true",
            help="see only what the session (--workspace, --agent) sees, and audit the recall under --session",
        )

    _verb(
        sub,
        "query",
        "search entries by substring",
        """Search entries by case-insensitive substring (ASCII folding). Hits are
              ranked by recall count and recency; each hit's recall count goes up.""",
        "memoryctl query tabs\nmemoryctl query --track agent --limit 50\n"
        "memoryctl query pytest --as-session --workspace ~/proj",
        arguments=_query_args,
    )

    def _add_args(p: argparse.ArgumentParser) -> None:
        _layer(p)
        p.add_argument("--tag", action="append", default=[], metavar="TAG", help="a tag (repeatable; ≤16, ≤32 chars each)")
        p.add_argument("--source", default="memoryctl", help="provenance label (default: memoryctl)")
        _text_arg(p, "the entry text")

    _verb(
        sub,
        "add",
        "add an entry",
        """Add one entry. Under write policy 'ask' the daemon asks for approval first;
              over budget it fails with BUDGET_EXCEEDED (nothing is truncated).""",
        """memoryctl add --track user --scope user-global "Prefers tabs over spaces"
              memoryctl add --track agent --scope workspace --tag ci "Run tests with make check"
              echo "long text" | memoryctl add --track user --scope user-global -""",
        arguments=_add_args,
    )

    def _replace_args(p: argparse.ArgumentParser) -> None:
        _layer(p)
        p.add_argument("--tag", action="append", metavar="TAG", help="new tags (repeatable); omit to keep the old ones")
        _id_arg(p)
        p.add_argument("match", metavar="MATCH", nargs="?", help="unique substring of the entry to replace (or --id)")
        _text_arg(p, "the new text")

    _verb(
        sub,
        "replace",
        "rewrite the one entry that MATCH (or --id) finds",
        """Rewrite exactly one entry, found by a unique case-insensitive substring of its
              text, or by its id (--id, as 'memoryctl list' shows it). The id stays, its
              version goes up. Tags are replaced when --tag is given, kept otherwise. Zero
              hits: ENTRY_NOT_FOUND; several: AMBIGUOUS_MATCH.""",
        'memoryctl replace --track user --scope user-global "tabs" "Prefers 4-space indents"\n'
        'memoryctl replace --track user --scope user-global --id 3f2a1b2c "Prefers 4-space indents"',
        arguments=_replace_args,
    )

    def _remove_args(p: argparse.ArgumentParser) -> None:
        _layer(p)
        _id_arg(p)
        p.add_argument("match", metavar="MATCH", nargs="?", help="unique substring of the entry to remove (or --id)")

    _verb(
        sub,
        "remove",
        "delete the one entry that MATCH (or --id) finds",
        """Delete exactly one entry, found by a unique case-insensitive substring of its
              text, or by its id (--id): the way to remove one of two entries with the same
              text. The approval shows the full text being deleted.""",
        'memoryctl remove --track agent --scope workspace "make check"\n'
        "memoryctl remove --track agent --scope workspace --id 3f2a1b2c",
        arguments=_remove_args,
    )

    def _consolidate_args(p: argparse.ArgumentParser) -> None:
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
        "consolidate",
        "merge several entries into one",
        """Atomically delete every entry found by the -m substrings (1 to 20, each must
              hit exactly one entry) and add one new entry: one approval, one transaction.""",
        'memoryctl consolidate --track user --scope user-global -m tabs -m indent "Prefers 4-space indents"',
        arguments=_consolidate_args,
    )

    _verb(
        sub,
        "budgets",
        "show budget use per track and scope",
        """Characters used and allowed per track × scope (UTF-16 code units, as the
          protocol counts them), over the whole store.""",
        "memoryctl budgets",
    )

    def _audit_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "action",
            nargs="?",
            choices=("list", "verify", "explain", "accept", "heads"),
            default="list",
            help="list (default), verify, explain, accept or heads",
        )
        p.add_argument("target", nargs="?", metavar="TEXT|ID|N",
                       help="explain: an entry's id, or a text that exactly one entry contains; "
                            "accept: the ledger row that records the change")
        p.add_argument("--limit", type=int, metavar="N", help="list: at most N rows (default 100)")
        p.add_argument("--heads", metavar="FILE",
                       help="verify: also check every head FILE witnessed for this store (memoryctl audit heads "
                            "prints them; the daemon keeps them in $XDG_STATE_HOME/memoryd/heads)")

    _verb(
        sub,
        "audit",
        "show the audit ledger; verify its hash chain; explain one entry's life",
        """The audit ledger: every write, denial, recall and snapshot, newest first.

              'audit verify' checks the ledger's hash chain, that every audit row since the
              chain's start is in it unchanged, and that replaying it gives the live entries;
              exit 1 on any break, naming the first bad row. 'audit explain TEXT|ID' tells one
              entry's life: every write, who asked, who approved and how, and which sessions'
              snapshots showed it.

              A change another program made to the store (dsh-memento writing it in place,
              or an edit behind memoryd's back) is recorded as a 'foreign' ledger row, and
              verify fails until 'audit accept N' records that you accepted it. 'audit heads'
              prints the ledger heads the daemon witnessed outside the store; keep a copy
              elsewhere and check it with 'audit verify --heads FILE'.

              verify and explain ask the daemon; with --db PATH they read that store
              themselves, read-only, without a daemon (refused while a daemon holds it).""",
        "memoryctl audit --limit 20\nmemoryctl audit verify\nmemoryctl audit verify --db ~/backup/memory.db\n"
        "memoryctl audit heads > ~/memoryd-heads\nmemoryctl audit verify --heads ~/memoryd-heads\nmemoryctl audit accept 42\n"
        'memoryctl audit explain "Prefers tabs"\nmemoryctl audit explain 3f2a1b2c-5d6e-4f70-8a9b-0c1d2e3f4a5b',
        arguments=_audit_args,
    )

    def _proposals_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "action",
            nargs="?",
            choices=("list", "approve", "dismiss"),
            default="list",
            help="list (default), approve or dismiss",
        )
        p.add_argument("id", nargs="?", metavar="ID", help="proposal id (or unique prefix) to approve or dismiss")
        p.add_argument("--status", choices=("pending", "approved", "dismissed"), help="list only proposals in this state")

    _verb(
        sub,
        "proposals",
        "list, approve or dismiss memory proposals",
        """Pending memory suggestions (for example from a compaction summary).
              'approve ID' writes the proposal through the normal write pipeline (approval,
              budget, audit); 'dismiss ID' drops it. ID may be a unique prefix.""",
        "memoryctl proposals\nmemoryctl proposals --status dismissed\n"
        "memoryctl proposals approve 3f2a\nmemoryctl proposals dismiss 3f2a",
        arguments=_proposals_args,
    )

    def _export_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--adapter", metavar="ID", help="export through this adapter (see 'memoryctl adapters')")
        p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (mode 0600) instead of stdout")
        p.add_argument("--force", action="store_true", help="let -o replace an existing FILE (refused otherwise)")

    _verb(
        sub,
        "export",
        "write every entry as JSON (or an adapter's format)",
        """Print the memory-export-v1 envelope (a complete backup), or with --adapter the
              adapter's document (e.g. markdown). Read-only: no approval, no audit row.""",
        "memoryctl export > memory.json\nmemoryctl export --adapter claude-code-memory-md -o CLAUDE.md\n"
        "memoryctl export -o memory.json --force   # replace yesterday's backup",
        arguments=_export_args,
    )

    def _import_args(p: argparse.ArgumentParser) -> None:
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
        arguments=_import_args,
    )

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

    def _snapshot_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--lang", choices=("en", "zh"), help="snapshot language (default: the daemon's)")

    _verb(
        sub,
        "snapshot",
        "print the memory snapshot a session sees",
        """Print the frozen memory block injected into a session's system prompt: what a
              session with this --session id, --workspace (--cwd) and --agent sees. Rendered
              once per session id, then frozen; the default id is new each run, so the
              default shows what a new session would see now.""",
        "memoryctl snapshot\nmemoryctl snapshot --session s-42 --cwd ~/proj --agent coder",
        arguments=_snapshot_args,
    )

    def _approve_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--reject", action="store_true", help="reject every approval without asking")
        p.add_argument("--count", type=int, metavar="N", help="exit after N decisions")
        p.add_argument("--init-key", action="store_true",
                       help="create the approver key ($XDG_CONFIG_HOME/memoryd/approver.key, mode 0600) that "
                            'approvers = "keyed" asks approvers to prove, print its path, and exit')

    _verb(
        sub,
        "approve",
        "answer approvals for other clients' writes",
        """Become an approver: writes from clients that cannot approve themselves (a
              headless agent, a script) are asked here, one at a time, with their complete
              payload. Prints a notice when another approver decided first. Runs until
              Ctrl-C or end of input. When the daemon runs with approvers = "keyed", it
              proves the approver key first (made once with --init-key).""",
        "memoryctl approve\nmemoryctl approve --reject   # deny everything, e.g. while away\n"
        "memoryctl approve --init-key   # once, before approvers = \"keyed\"",
        arguments=_approve_args,
    )

    _verb(
        sub,
        "watch",
        "print changes to the entries a session sees, as they happen",
        """Print one line per change (added, updated, removed) that any client commits to an
              entry this session (--session, --workspace/--cwd, --agent) sees, with the
              writing session's id; --json prints each event as one JSON object per line.
              Runs until Ctrl-C or SIGTERM (exit 0, quietly), or until the daemon goes away
              (exit 3).""",
        "memoryctl watch\nmemoryctl watch --cwd ~/proj --agent coder --json",
    )

    _verb(
        sub,
        "socket",
        "print the socket path memoryctl uses (no daemon contact)",
        """Print the absolute path of the daemon socket memoryctl connects to: --socket,
          else $MEMORYD_SOCKET, else the per-user default. Contacts no daemon and starts
          none, so it also works before one runs. --json prints {"socket": PATH}.""",
        'memoryctl socket\nmemoryctl --socket /tmp/m.sock socket',
    )
    _verb(
        sub,
        "rpc",
        "send raw NDJSON lines from stdin to the daemon, print what it sends",
        """Connect to the daemon's socket and copy stdin to it and what it sends to stdout,
          byte for byte: JSON-RPC requests in, replies and notifications out
          (docs/clients.md has the wire). At the end of stdin, the daemon answers what it
          was sent, then memoryctl exits 0. Starts no daemon: without one, exit 3.""",
        """echo '{"jsonrpc":"2.0","id":1,"method":"daemon/status"}' | memoryctl rpc\nmemoryctl rpc < requests.ndjson""",
    )

    return parser


def verbs(parser: Parser | None = None) -> dict[str, Parser]:
    """Verb name → its parser, with its options added (for docs and tests)."""
    from .parsing import Verb

    parser = parser or build_parser()
    return {name: p.complete() if isinstance(p, Verb) else p for name, p in parser.verb_parsers.items()}


def _parse_all(words: list[str]) -> argparse.Namespace | int:
    """``words`` read by argparse, or the exit status when it printed help or an error."""
    parser = build_parser(words)
    try:
        try:
            return _parse(parser, words)
        except _Partial:  # the parser with every verb says what is wrong
            parser = build_parser()
            return _parse(parser, words)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


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
    words = sys.argv[1:] if argv is None else list(argv)
    quick = quick_args(words)
    parsed = _parse_all(words) if quick is None else quick
    if isinstance(parsed, int):
        return parsed
    args: Args = parsed
    if not args.verb:
        build_parser().print_help(sys.stderr)
        return EXIT_USAGE
    ctx = Ctx(args, socket=_socket(args), fit=_isatty(sys.stdout))
    if args.verb in ("socket", "rpc"):  # no client, no autostart
        from .local import cmd_rpc, cmd_socket

        return cmd_socket(ctx) if args.verb == "socket" else cmd_rpc(ctx)
    try:
        if args.verb in LEAN_VERBS and not args.json:
            return run_quick(ctx)
        from .commands import run_async

        return run_async(ctx)
    except BrokenPipeError:  # `memoryctl list | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        if args.verb == "approve":
            print("", file=sys.stderr)
            return EXIT_OK
        if args.verb == "watch":  # Ctrl-C before the watch began: as quiet as after
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
