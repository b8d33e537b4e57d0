"""memoryctl's verbs: the one table (:data:`VERBS`) of each one's summary, description,
examples and options, from which :func:`memoryd_client.manual.build_parser` builds the
parser."""

from __future__ import annotations

import argparse
import inspect
import textwrap
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from memoryd_protocol.constants import SCOPES, TRACKS

from .parsing import Verb


class VerbSpec(NamedTuple):
    """One verb: its name, the line the verbs' list shows, its description and examples,
    and what adds its options (and actions)."""

    name: str
    summary: str
    description: str
    epilog: str
    arguments: Callable[[Verb], object] | None


#: Every verb, in the order --help lists them: the one table the parser is built from.
VERBS: list[VerbSpec] = []


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


def _match(p: argparse.ArgumentParser, help: str) -> None:
    """The entry a verb acts on: --id, or a unique substring MATCH."""
    p.add_argument("--id", dest="entry_id", metavar="ID",
                   help="the entry's id instead of MATCH: the full id or a unique prefix (as 'memoryctl list' shows it)")
    p.add_argument("match", metavar="MATCH", nargs="?", help=help)


def _text_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("text", metavar="TEXT", help=f"{help} ('-' reads it from stdin)")


#: the last line of every verb's help
GLOBAL_OPTIONS_LINE = ("Every verb also takes the global options (--socket, --json, --yes, --cwd,\n"
                       "--agent, --session, ...): see 'memoryctl --help'.")


def _epilog(examples: str) -> str:
    shown = "examples:\n" + textwrap.indent(inspect.cleandoc(examples), "  ") + "\n\n" if examples else ""
    return shown + GLOBAL_OPTIONS_LINE


def _verb(name: str, summary: str, description: str, examples: str = "",
          arguments: Callable[[Verb], object] | None = None) -> None:
    VERBS.append(VerbSpec(name, summary, inspect.cleandoc(description), _epilog(examples), arguments))


def _action(verb: Verb, name: str, summary: str, description: str, examples: str,
            arguments: Callable[[Verb], object] | None = None) -> None:
    verb.add_action(name, summary, inspect.cleandoc(description), _epilog(examples), arguments)


_verb(
    "list",
    "list every entry (all agents and workspaces)",
    """List every memory entry in creation order, across all agents and workspaces
          (the management view). --track/--scope narrow the table.""",
    "memoryctl list\nmemoryctl list --track user --json",
    arguments=partial(_layer, required=False),
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
    "add",
    "add an entry",
    """Add one entry. Under write policy 'ask' the daemon asks for approval first;
          over budget it fails with BUDGET_EXCEEDED (nothing is truncated).""",
    """memoryctl add --track user --scope user-global "Prefers tabs over spaces"
          memoryctl add --track agent --scope workspace --tag ci "Run tests with make check"
          echo "long text" | memoryctl add --track user --scope user-global -""",
    arguments=_add_args,
)


def _rewrite_args(p: argparse.ArgumentParser, verb: str) -> None:
    _layer(p)
    p.add_argument("--tag", action="append", metavar="TAG", help="new tags (repeatable); omit to keep the old ones")
    _match(p, f"unique substring of the entry to {verb} (or --id)")


def _replace_args(p: argparse.ArgumentParser) -> None:
    _rewrite_args(p, "replace")
    _text_arg(p, "the new text")


_verb(
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


_verb(
    "edit",
    "edit one entry's text in $EDITOR",
    """Open the entry's text in $VISUAL, else $EDITOR, else vi; when the editor exits
          with the text changed, submit it as a replace of that entry (by its id), with the
          normal approval. An unchanged text writes nothing; an emptied one is refused
          (memoryctl remove deletes). Needs a terminal.""",
    'memoryctl edit --track user --scope user-global "tabs"\n'
    "EDITOR=nano memoryctl edit --track agent --scope workspace --id 3f2a1b2c",
    arguments=partial(_rewrite_args, verb="edit"),
)


def _remove_args(p: argparse.ArgumentParser) -> None:
    _layer(p)
    _match(p, "unique substring of the entry to remove (or --id)")


_verb(
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
    p.add_argument("--source", default="memoryctl", help="provenance label of the new entry (default: memoryctl)")
    _text_arg(p, "the merged entry's text")


_verb(
    "consolidate",
    "merge several entries into one",
    """Atomically delete every entry found by the -m substrings (1 to 20, each must
          hit exactly one entry) and add one new entry: one approval, one transaction.""",
    'memoryctl consolidate --track user --scope user-global -m tabs -m indent "Prefers 4-space indents"',
    arguments=_consolidate_args,
)


def _share_args(p: argparse.ArgumentParser) -> None:
    _layer(p, required=False)
    _match(p, "unique substring of the one entry to share (or --id); neither: every entry")


_verb(
    "share",
    "move an agent's own entries to the shared layer",
    """Move entries out of the --agent layer into the shared layer that every agent
          sees: each entry is consolidated alone (same text and tags, a new id), with
          its own approval. Without MATCH or --id it moves every entry of the layer: the
          user-global ones, and the workspace ones of --cwd (default: the current
          directory); --track and --scope narrow that. A 'no' keeps that entry where it
          is and asks about the next.""",
    """memoryctl share --agent claude-code
          memoryctl share --agent gemini-cli --cwd ~/proj --scope workspace
          memoryctl share --agent codex "pnpm"
          memoryctl share --agent codex --id 3f2a1b2c""",
    arguments=_share_args,
)


_verb(
    "budgets",
    "show budget use per track and scope",
    """Characters used and allowed per track × scope (UTF-16 code units, as the
      protocol counts them), over the whole store.""",
    "memoryctl budgets",
)


def _limit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, metavar="N", help="at most N rows (default 100)")


def _heads(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--heads", metavar="FILE", help=what)


def _verify_args(q: argparse.ArgumentParser) -> None:
    _heads(q, "also check every head FILE witnessed for this store (memoryctl audit heads prints them; the daemon "
              "keeps the default store's in $XDG_STATE_HOME/memoryd/heads, any other's beside it in "
              "<db>.memoryd-heads)")
    q.add_argument("--against", metavar="URL", help="also check that this ledger extends the chain of the replica "
                   "at URL (its newest row must be a row of this chain): the replica witnesses it off this machine")


def _audit_args(p: Verb) -> None:
    _limit(p)  # for 'memoryctl audit --limit N', which lists
    p.set_defaults(target=None, limit=None, heads=None, against=None)
    _action(p, "list", "list the ledger, newest first (the default)",
            """The audit ledger, newest first: every write, denial, recall and snapshot,
               with its outcome and who asked and approved.""",
            "memoryctl audit\nmemoryctl audit list --limit 20", _limit)
    _action(p, "verify", "verify the hash chain, the audit rows and the live entries",
            """Check the ledger's hash chain, that every audit row since the chain's start
               is in it unchanged, and that replaying it gives the live entries; exit 1 on
               any break, naming the first bad row. With --db PATH it reads that store
               itself, read-only, without a daemon (refused while a daemon holds it).""",
            "memoryctl audit verify\nmemoryctl audit verify --db ~/backup/memory.db\n"
            "memoryctl audit verify --heads ~/memoryd-heads\n"
            "memoryctl audit verify --against s3://bucket/memory",
            _verify_args)
    _action(p, "explain", "tell one entry's life: every write, who asked and approved",
            """Tell one entry's life: every write, who asked, who approved and how, and which
               sessions' snapshots showed it. TEXT|ID is an entry's id (or a prefix of it),
               or a text that exactly one entry contains. With --db PATH it reads that store
               itself, read-only, without a daemon.""",
            'memoryctl audit explain "Prefers tabs"\nmemoryctl audit explain 3f2a1b2c',
            lambda q: q.add_argument("target", metavar="TEXT|ID",
                                     help="an entry's id, or a text that exactly one entry contains"))
    _action(p, "accept", "accept a change another program made to the store",
            """A change another program made to the store (dsh-memento writing it in place,
               or an edit behind memoryd's back) is recorded as a 'foreign' ledger row, and
               verify fails until 'audit accept N' records that you accepted it. Shows the
               change and asks first (--yes accepts without asking).""",
            "memoryctl audit verify   # names the row N\nmemoryctl audit accept 42",
            lambda q: q.add_argument("target", metavar="N", help="the ledger row that records the change"))
    _action(p, "heads", "print the ledger heads witnessed outside the store",
            """Print the ledger heads the daemon witnessed outside the store (one line each),
               from the store's heads file: $XDG_STATE_HOME/memoryd/heads for the default
               store, <db>.memoryd-heads beside any other. Keep a copy elsewhere and check
               it with 'audit verify --heads FILE'.""",
            "memoryctl audit heads > ~/memoryd-heads",
            lambda q: _heads(q, "read the heads from FILE instead of the store's heads file"))
    p.set_defaults(action="list")  # 'memoryctl audit' alone lists (after the actions, which reset it)


_verb(
    "audit",
    "show the audit ledger; verify its hash chain; explain one entry's life",
    """The audit ledger: every write, denial, recall and snapshot. Without an ACTION
          it lists the ledger. Run 'memoryctl audit ACTION --help' for an action's options.""",
    "memoryctl audit --limit 20\nmemoryctl audit verify\nmemoryctl audit explain \"Prefers tabs\"",
    arguments=_audit_args,
)


def _proposal_id(q: argparse.ArgumentParser) -> None:
    q.add_argument("id", metavar="ID", help="the proposal's id, or a unique prefix of it")


def _status(p: argparse.ArgumentParser) -> None:
    p.add_argument("--status", choices=("pending", "approved", "dismissed"), help="list only proposals in this state")


def _proposals_args(p: Verb) -> None:
    _status(p)  # for 'memoryctl proposals --status S', which lists
    p.set_defaults(id=None, status=None)
    _action(p, "list", "list the proposals (the default)",
            "List the memory proposals, newest first, with their state.",
            "memoryctl proposals\nmemoryctl proposals list --status dismissed", _status)
    _action(p, "approve", "write a proposal through the normal approval",
            """Write the proposal through the normal write pipeline: approval, budget,
               audit.""",
            "memoryctl proposals approve 3f2a", _proposal_id)
    _action(p, "dismiss", "drop a proposal", "Drop the proposal; nothing is written.",
            "memoryctl proposals dismiss 3f2a", _proposal_id)
    p.set_defaults(action="list")


_verb(
    "proposals",
    "list, approve or dismiss memory proposals",
    """Pending memory suggestions (for example from a compaction summary). Without an
          ACTION it lists them. Run 'memoryctl proposals ACTION --help' for an action's
          options.""",
    "memoryctl proposals\nmemoryctl proposals approve 3f2a\nmemoryctl proposals dismiss 3f2a",
    arguments=_proposals_args,
)


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adapter", metavar="ID", help="export through this adapter (see 'memoryctl adapters')")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (mode 0600) instead of stdout")
    p.add_argument("--force", action="store_true", help="let -o replace an existing FILE (refused otherwise)")


_verb(
    "export",
    "write every entry as JSON (or an adapter's format)",
    """Print the memory-export-v1 envelope (a complete backup), or with --adapter the
          adapter's document as dsh-memento writes it (for markdown, {plugin, text}; both
          providers import it back). Read-only: no approval, no audit row.""",
    "memoryctl export > memory.json\nmemoryctl export --adapter claude-code-memory-md -o claude.json\n"
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
    p.add_argument("--track", choices=TRACKS, help="with --adapter: put every entry in this track")
    p.add_argument("--scope", choices=SCOPES, help="with --adapter: put every entry in this scope")
    p.add_argument("file", metavar="FILE", help="file to import ('-' reads stdin)")


_verb(
    "import",
    "import an export envelope or an adapter's file",
    """Import entries through seed: one approval for the whole batch, a budget check
          of the whole batch, one transaction. Without --adapter FILE must be a
          memory-export-v1 envelope; with --adapter it is that adapter's format (JSON or
          text, detected; --format to force). A markdown file is read as dsh-memento reads
          it: every entry in user/user-global, unless --track/--scope say otherwise.
          Entries that already exist (same track, scope, workspace, agent and text) are
          skipped, so importing the same backup or CLAUDE.md again changes nothing;
          --allow-duplicates imports them anyway.""",
    "memoryctl import memory.json\nmemoryctl import --adapter claude-code-memory-md CLAUDE.md\n"
    "memoryctl import --adapter claude-code-memory-md --track agent --scope workspace CLAUDE.md\n"
    "memoryctl import --adapter mem0 - < facts.json",
    arguments=_import_args,
)


_verb(
    "adapters",
    "list the import/export adapters",
    """The adapters the daemon knows (mem0, hermes-memory-md, claude-code-memory-md, and
      any installed plugin adapters).""",
    "memoryctl adapters",
)


_verb(
    "status",
    "show the daemon's status",
    """The daemon's socket, pid, version, uptime and write policy; its store (path and
      schema), config file and log file; its connections, pending approvals and write
      queue depth. --json prints the daemon/status result (the wire shape).""",
    "memoryctl status\nmemoryctl status --json",
)


def _replicate_args(p: Verb) -> None:
    _action(p, "status", "the replica, its state and its lag (the default)",
            """The replica the daemon ships the store to ([replicate] in its config): its URL
               without secrets, its state, and its lag: the newest ledger row the replica
               held when last read against the daemon's head, in rows and in seconds since
               the oldest row it lacks was written. --json prints daemon/status's
               replication object (null when replication is not configured).""",
            "memoryctl replicate status\nmemoryctl replicate status --json")


_verb(
    "replicate",
    "show the store's replication to its replica",
    """Replication of the store by Litestream, as the running daemon sees it. Run
          'memoryctl replicate ACTION --help' for an action's options.""",
    "memoryctl replicate status --json",
    arguments=_replicate_args,
)


def _restore_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", help="the replica: file:///path, s3://bucket/path or sftp://user@host/path "
                   "(an s3 endpoint and credentials file come from the config's [replicate] when its url is URL)")
    p.add_argument("--heads", metavar="FILE", help="check the copy against the heads FILE witnessed (default: "
                   "the store's own heads file, when it has one)")
    p.add_argument("--no-heads", action="store_true", help="do not check the copy against the store's heads file: "
                   "to take over a replica whose history parted from this machine's (that heads file is kept beside "
                   "the replaced store)")


_verb(
    "restore",
    "copy a replica into the store, once it verifies",
    """Copy the replica at URL into a new file next to the store (--db PATH, else the
      default store), check it as 'audit verify' does, against the heads witnessed for
      the store, and only if it verifies and no daemon holds the store, move it in
      (mode 0600, in one rename). The store it replaces is kept beside it as
      <db>.replaced-<time>. Otherwise it names the first bad row and changes nothing.
      A daemon started on the restored store continues its chain.""",
    "memoryctl restore file:///mnt/backup/memory\nmemoryctl --db ~/memory.db restore s3://bucket/memory",
    _restore_args,
)


_verb(
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
    "snapshot",
    "print the memory snapshot a session sees",
    """Print the frozen memory block injected into a session's system prompt: what a
          session with this --session id, --workspace (--cwd) and --agent sees. Rendered
          once per session id, then frozen; the default id is new each run, so the
          default shows what a new session would see now.""",
    "memoryctl snapshot\nmemoryctl snapshot --session s-42 --cwd ~/proj --agent coder",
    arguments=_snapshot_args,
)


def _older_than(q: Verb) -> None:
    q.add_argument("--older-than", type=float, metavar="DAYS",
                   help="only the snapshots frozen more than DAYS days ago (default: every ended session's)")


def _snapshots_args(p: Verb) -> None:
    p.set_defaults(older_than=None)
    _action(p, "prune", "delete the frozen snapshots of sessions that ended",
            """Delete the frozen snapshots of the sessions no open connection holds (and
               the texts no other session shows), freeing room under max_snapshots and
               max_snapshot_bytes at once, without a restart. The ledger keeps each one's
               digest and records the prune, so 'audit verify' still holds. A session whose
               snapshot was pruned gets a new one if it is named again. Only an approver
               may prune (under approvers = "interactive", from a terminal).""",
            "memoryctl snapshots prune\nmemoryctl snapshots prune --older-than 30", _older_than)


_verb(
    "snapshots",
    "prune the frozen snapshots of sessions that ended",
    """The frozen snapshots the store keeps, one per session. Run 'memoryctl snapshots
          prune --help' for its options.""",
    "memoryctl snapshots prune",
    arguments=_snapshots_args,
)


def _approve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reject", action="store_true", help="reject every approval without asking")
    p.add_argument("--count", type=int, metavar="N", help="exit after N decisions")
    p.add_argument("--init-key", action="store_true",
                   help="create the approver key ($XDG_CONFIG_HOME/memoryd/approver.key, mode 0600) that "
                        'approvers = "keyed" asks approvers to prove, print its path, and exit')


_verb(
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
    "socket",
    "print the socket path memoryctl uses (no daemon contact)",
    """Print the absolute path of the daemon socket memoryctl connects to: --socket,
      else $MEMORYD_SOCKET, else the per-user default. Contacts no daemon and starts
      none, so it also works before one runs. --json prints {"socket": PATH}.""",
    'memoryctl socket\nmemoryctl --socket /tmp/m.sock socket',
)


_verb(
    "rpc",
    "send raw NDJSON lines from stdin to the daemon, print what it sends",
    """Connect to the daemon's socket and copy stdin to it and what it sends to stdout,
      byte for byte: JSON-RPC requests in, replies and notifications out
      (docs/clients.md has the wire). At the end of stdin, the daemon answers what it
      was sent, then memoryctl exits 0. Starts no daemon: without one, exit 3.""",
    """echo '{"jsonrpc":"2.0","id":1,"method":"daemon/status"}' | memoryctl rpc\nmemoryctl rpc < requests.ndjson""",
)


def _completion_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=("bash", "zsh", "fish"), help="the shell to complete memoryctl in")
    p.add_argument("--install", action="store_true",
                   help="write the script where the shell looks for it, for this user, and print that path")


_verb(
    "completion",
    "print (or install) the shell completion script",
    """Print the completion script for bash, zsh or fish: verbs, actions, options and
      their choices. --install writes it where that shell looks for a user's scripts
      (bash: ~/.local/share/bash-completion/completions; zsh: ~/.local/share/zsh/
      site-functions, which must be in $fpath; fish: ~/.config/fish/completions).
      Contacts no daemon.""",
    """memoryctl completion bash --install
      memoryctl completion zsh > ~/.zfunc/_memoryctl
      source <(memoryctl completion bash)   # this shell only""",
    arguments=_completion_args,
)


#: the verbs' names, in the table's order
VERB_NAMES = tuple(v.name for v in VERBS)
