"""What memoryctl shows of an entry is what is stored. Ids: every table and one-line message
shows the first 8 characters (render.SHORT_ID), --json and ``audit explain`` the full id,
and the short form is taken back wherever an id is typed. Sources: the approval prompt's
``source:`` line is the source the write stores, for add, replace, consolidate and import."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import memoryd_client as mc
import pytest
from memoryd_client.render import SHORT_ID, short
from test_cli_edit import MEMORYCTL, UG, env_with, hermetic_env, on_pty, sock

#: daemon_factory's daemons run in the test process (conftest), memoryctl is a subprocess,
#: and no memoryctl here touches the user's real socket or config
pytestmark = [pytest.mark.inprocess, pytest.mark.usefixtures(hermetic_env.__name__)]


def run(d: Any, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """memoryctl without a terminal (no colour, writes approved by --yes where asked)."""
    r = subprocess.run([*MEMORYCTL, *sock(d), *args], input=input, stdin=None if input else subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60, start_new_session=True)
    assert r.returncode == 0, (args, r.stderr)
    return r


def ids(d: Any) -> list[str]:
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return [e.id for e in c.list()]


def column(table: str, n: int = 0) -> list[str]:
    """The ``n``-th column of a table's rows (its header left out)."""
    return [row.split()[n] for row in table.splitlines()[1:]]


def test_tables_and_messages_show_short_ids_and_json_full_ones(daemon: Any, tmp_path: Path) -> None:
    d = daemon
    out = run(d, "add", *UG, "Prefers tabs").stdout
    [tabs] = ids(d)
    assert out == f"added {tabs[:8]} (user/user-global 12/2000 chars)\n"
    run(d, "add", *UG, "Uses vim")
    tabs, vim = ids(d)
    assert column(run(d, "list").stdout) == [tabs[:8], vim[:8]]
    assert column(run(d, "query", "vim").stdout.rsplit("\n", 2)[0]) == [vim[:8]]
    assert [e["id"] for e in json.loads(run(d, "list", "--json").stdout)] == [tabs, vim]

    assert run(d, "replace", *UG, "tabs", "Prefers spaces").stdout.startswith(f"replaced {tabs[:8]}, now version 2 (")
    audit = run(d, "audit").stdout
    assert [r["entryId"] for r in json.loads(run(d, "audit", "--json").stdout)] == [tabs, vim, tabs]
    assert column(audit, 5) == [tabs[:8], vim[:8], tabs[:8]]  # ENTRY: after SEQ, TIME's two words, ACTION, LAYER

    with mc.connect_sync(d.socket_path, timeout=10) as c:
        proposal = c.proposals_create({"kind": "compaction", "track": "user", "scope": "user-global",
                                       "text": "Likes short answers"}, "sess-a")
    assert proposal is not None
    assert column(run(d, "proposals").stdout) == [proposal.id[:8]]
    assert [p["id"] for p in json.loads(run(d, "proposals", "--json").stdout)] == [proposal.id]
    run(d, "proposals", "dismiss", proposal.id[:8])  # the short form, taken back

    # audit explain: the full id in its header, and the short form taken back, also for an
    # entry that is gone, and offline (--db) too
    life = run(d, "audit", "explain", vim[:8]).stdout
    assert life.splitlines()[0] == f"entry {vim}"
    assert run(d, "remove", *UG, "--id", vim[:SHORT_ID]).stdout.startswith(f"removed {vim[:8]} (")
    assert run(d, "audit", "explain", vim[:8]).stdout.splitlines()[:2] == [
        f"entry {vim}", "  now:     removed (no longer in the store)"]
    assert short(vim) == vim[:8]


def test_audit_explain_takes_a_short_id_offline(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory()
    run(d, "add", *UG, "Prefers tabs")
    run(d, "add", *UG, "Uses vim")
    tabs, vim = ids(d)
    run(d, "remove", *UG, "vim")
    assert d.stop() == 0
    for target, header in ((tabs[:8], f"entry {tabs}"), (vim[:8], f"entry {vim}"), ("tabs", f"entry {tabs}")):
        r = subprocess.run([*MEMORYCTL, "--no-autostart", "audit", "explain", "--db", str(d.db_path), target],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == header


def test_an_edit_by_short_id(daemon: Any) -> None:
    run(daemon, "add", *UG, "Prefers tabs")
    [tabs] = ids(daemon)
    code, shown = on_pty([*sock(daemon), "edit", *UG, "--id", tabs[:8]], env_with(EDITOR="sed -i s/tabs/spaces/"))
    assert (code, shown) == (0, f"replaced {tabs[:8]}, now version 2 (user/user-global 14/2000 chars)\n")


# --- the prompt's source is the stored source ----------------------------------------------


def prompt_source(stderr: str) -> str:
    """The ``source:`` line of the one approval the command was asked."""
    [source] = re.findall(r"^  source:  (.*)$", stderr, re.M)
    return source


def sources(d: Any) -> dict[str, str]:
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return {e.text: e.source for e in c.list()}


def test_the_prompts_source_is_what_is_stored(ask_daemon: Any, tmp_path: Path) -> None:
    d = ask_daemon
    # add: memoryctl's own label, or --source
    r = run(d, "--yes", "add", *UG, "Prefers tabs")
    assert prompt_source(r.stderr) == sources(d)["Prefers tabs"] == "memoryctl"
    r = run(d, "--yes", "add", *UG, "--source", "notes", "Uses vim")
    assert prompt_source(r.stderr) == sources(d)["Uses vim"] == "notes"
    # replace keeps the entry's source: the prompt names that one
    r = run(d, "--yes", "replace", *UG, "vim", "Uses neovim")
    assert prompt_source(r.stderr) == sources(d)["Uses neovim"] == "notes"
    # consolidate: memoryctl's own label as for add, and the prompt says so
    r = run(d, "--yes", "consolidate", *UG, "-m", "tabs", "-m", "neovim", "Prefers tabs in neovim")
    assert prompt_source(r.stderr) == sources(d)["Prefers tabs in neovim"] == "memoryctl"
    # import: the envelope's entries' source; an adapter's entries get the adapter's id
    backup = tmp_path / "backup.json"
    backup.write_text(json.dumps({"plugin": "dsh-memento", "schema": "memory-export-v1", "entries": [
        {"track": "user", "scope": "user-global", "text": f"fact {n}", "source": "backup"} for n in range(2)]}))
    r = run(d, "--yes", "import", str(backup))
    assert prompt_source(r.stderr) == sources(d)["fact 0"] == sources(d)["fact 1"] == "backup"
    r = run(d, "--yes", "import", "--adapter", "mem0", "-", input=json.dumps([{"memory": "Lives in Berlin"}]))
    assert prompt_source(r.stderr) == sources(d)["Lives in Berlin"] == "mem0"
