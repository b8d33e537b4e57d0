"""``memoryctl edit`` against a real daemon, on a pseudo-terminal as a user runs it: the
entry's text in $EDITOR (a small script here, or ``sed -i``), then a replace by the entry's
full id through the normal approval, ``--yes`` or the prompt. What writes nothing: no
change, an empty text, an editor that fails, no terminal, a match that finds no one entry,
an entry that changed while the editor was open. Ctrl-C in the editor is the editor's."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import memoryd_client as mc
import pytest
from memoryd_client.editing import editor_command
from memoryd_client.running import UsageError

#: daemon_factory's daemons run in the test process (conftest); memoryctl is a subprocess
pytestmark = pytest.mark.inprocess

MEMORYCTL = [sys.executable, "-m", "memoryd_client"]
UG = ["--track", "user", "--scope", "user-global"]
PROMPT = b"Approve? [y/N] "

#: The editor: ``EDITOR="python editor.py SPEC"`` (an editor with an argument, as
#: ``code --wait``), run as ``sh -c '$EDITOR "$@"'`` with the file's path last. It logs what
#: it was given (argv, the text, the modes of the file and of its directory), does what
#: SPEC says meanwhile (waits for a line, writes through another client), then writes SPEC's
#: text and exits with SPEC's status.
EDITOR_SCRIPT = """
import json, os, signal, sys
spec = json.load(open(sys.argv[1]))
path = sys.argv[-1]
with open(path, encoding="utf-8", newline="") as f:
    log = {"argv": sys.argv[1:], "text": f.read(), "mode": os.stat(path).st_mode & 0o777,
           "dir_mode": os.stat(os.path.dirname(path)).st_mode & 0o777, "path": path}
if spec.get("wait"):
    got = []
    signal.signal(signal.SIGINT, lambda *_: got.append(True))
    print("editor: waiting", flush=True)
    sys.stdin.readline()
    log["interrupted"] = bool(got)
meanwhile = spec.get("meanwhile")
if meanwhile:
    import memoryd_client as mc
    with mc.connect_sync(spec["socket"], session="other", on_approval=lambda a: True, timeout=30) as c:
        getattr(c, meanwhile[0])(meanwhile[1])
if "write" in spec:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(spec["write"])
with open(spec["log"], "w") as f:
    json.dump(log, f)
sys.exit(spec.get("exit", 0))
"""


@pytest.fixture(autouse=True)
def hermetic_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No memoryctl here touches the user's real socket, store or config."""
    monkeypatch.delenv("MEMORYD_SOCKET", raising=False)
    for var, name in (("XDG_RUNTIME_DIR", "run"), ("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data")):
        path = tmp_path / "xdg" / name
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(path))


class Editor:
    """:data:`EDITOR_SCRIPT` with one SPEC: ``command`` for $EDITOR, ``log()`` once it ran."""

    def __init__(self, tmp: Path, **spec: Any) -> None:
        tmp.mkdir(exist_ok=True)
        n = len(list(tmp.iterdir()))
        script, spec_file, self.log_path = tmp / "editor.py", tmp / f"spec-{n}.json", tmp / f"log-{n}.json"
        script.write_text(EDITOR_SCRIPT)
        spec_file.write_text(json.dumps({**spec, "log": str(self.log_path)}))
        self.command = f"{'exec ' if spec.get('wait') else ''}{sys.executable} {script} {spec_file}"

    def ran(self) -> bool:
        return self.log_path.exists()

    def log(self) -> dict[str, Any]:
        log: dict[str, Any] = json.loads(self.log_path.read_text())
        return log


def env_with(**values: str) -> dict[str, str]:
    """The environment of memoryctl here: a terminal that is not dumb, no colour (the text
    itself is read), no editor but the ones ``values`` name."""
    env = {k: v for k, v in os.environ.items() if k not in ("VISUAL", "EDITOR", "FORCE_COLOR")}
    return {**env, "TERM": "xterm", "NO_COLOR": "1", **values}


def on_pty(args: Sequence[str], env: dict[str, str], *, answers: Sequence[bytes] = (),
           steps: Sequence[tuple[bytes, bytes]] = ()) -> tuple[int, str]:
    """memoryctl ``args`` with a new pseudo-terminal as its stdin, stdout, stderr and
    controlling terminal (util-linux ``setsid --ctty``). Each ``Approve? [y/N]`` is answered
    with the next of ``answers``; each ``(needle, reply)`` of ``steps`` writes ``reply`` once
    ``needle`` was shown. Returns the exit status and everything shown (lines end in \\n)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["setsid", "--ctty", *MEMORYCTL, *args], stdin=slave, stdout=slave, stderr=slave,
                            env=env)
    os.close(slave)
    out, left, todo = b"", list(answers), list(steps)
    try:
        while True:
            assert select.select([master], [], [], 30)[0], out
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every copy of the terminal is closed
                chunk = b""
            if not chunk:
                break
            out += chunk
            if todo and todo[0][0] in out:
                os.write(master, todo.pop(0)[1])
            if out.endswith(PROMPT):
                assert left, f"an approval nobody expected: {out!r}"
                os.write(master, left.pop(0) + b"\n")
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
    assert not left and not todo, out
    return code, out.decode(errors="replace").replace("\r\n", "\n")


def sock(d: Any) -> list[str]:
    return ["--socket", str(d.socket_path), "--no-autostart"]


def add(d: Any, *texts: str) -> list[str]:
    with mc.connect_sync(d.socket_path, session="seed", on_approval=lambda a: True, timeout=10) as c:
        return [c.add({"track": "user", "scope": "user-global", "text": t}).entry.id for t in texts]


def store(d: Any) -> tuple[list[Any], int]:
    """Entries and audit length: what a refused edit must leave as it was."""
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return [mc.plain(e) for e in c.list()], len(c.audit_list(10000))


def entries(d: Any) -> list[tuple[str, str, int]]:
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return [(e.id, e.text, e.version) for e in c.list()]


def error_line(shown: str) -> str:
    lines = [ln for ln in shown.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, shown
    return lines[0]


# --- the editor, chosen as git chooses it ------------------------------------------------


def test_the_editor_is_visual_then_editor_then_vi() -> None:
    assert editor_command({"TERM": "xterm", "VISUAL": "code --wait", "EDITOR": "nano"}) == ("code --wait", "$VISUAL")
    assert editor_command({"TERM": "xterm", "VISUAL": "", "EDITOR": "nano"}) == ("nano", "$EDITOR")
    assert editor_command({"TERM": "xterm"}) == ("vi", "the default")
    # a dumb terminal (or none named) skips $VISUAL, and has no default
    assert editor_command({"TERM": "dumb", "VISUAL": "code --wait", "EDITOR": "ed"}) == ("ed", "$EDITOR")
    assert editor_command({"VISUAL": "code --wait", "EDITOR": "ed"}) == ("ed", "$EDITOR")
    with pytest.raises(UsageError, match=r"^the terminal is dumb \(TERM is unset or dumb\) and \$EDITOR is not "
                                         r"set: set EDITOR to an editor that works here, or change the entry with "
                                         r"memoryctl replace$"):
        editor_command({"TERM": "dumb", "VISUAL": "code --wait"})


# --- edits that land ---------------------------------------------------------------------


def test_edit_under_yes_replaces_the_entry_by_its_full_id(ask_daemon: Any, tmp_path: Path) -> None:
    d = ask_daemon
    tabs, vim = add(d, "Prefers tabs", "Uses vim")
    editor = Editor(tmp_path / "ed", write="Prefers spaces\n")
    code, shown = on_pty([*sock(d), "--yes", "edit", *UG, "tabs"], env_with(EDITOR=editor.command))
    assert code == 0, shown
    assert shown.endswith(f"replaced {tabs[:8]}, now version 2 (user/user-global 22/2000 chars)\n")
    assert "shared by every agent:\n  + Prefers spaces\n  - Prefers tabs\n" in shown
    assert "\nmemoryctl: approved (--yes)\n" in shown
    assert entries(d) == [(tabs, "Prefers spaces", 2), (vim, "Uses vim", 1)]
    # the editor got its argument, then the entry's text (with a final newline) in a private
    # file in a private directory, both gone now
    log = editor.log()
    assert log["argv"][0].endswith(".json") and log["text"] == "Prefers tabs\n"
    assert (log["mode"], log["dir_mode"]) == (0o600, 0o700)
    assert not os.path.lexists(log["path"]) and not os.path.lexists(os.path.dirname(log["path"]))

    # sed -i as the editor; the entry named by the short id 'memoryctl list' shows
    code, shown = on_pty([*sock(d), "--yes", "edit", *UG, "--id", vim[:8]], env_with(EDITOR="sed -i s/vim/neovim/"))
    assert code == 0, shown
    assert entries(d) == [(tabs, "Prefers spaces", 2), (vim, "Uses neovim", 2)]


def test_edit_through_the_approval_prompt(ask_daemon: Any, tmp_path: Path) -> None:
    d = ask_daemon
    [tabs] = add(d, "Prefers tabs")
    editor = Editor(tmp_path / "ed", write="Prefers spaces\n")
    code, shown = on_pty([*sock(d), "edit", *UG, "tabs"], env_with(EDITOR=editor.command), answers=[b"y"])
    assert code == 0, shown
    assert "replace in user/user-global, shared by every agent:\n" \
           "  + Prefers spaces\n  - Prefers tabs\n" in shown
    assert entries(d) == [(tabs, "Prefers spaces", 2)]

    # answered no: the daemon denies it, and the entry stays as it was
    editor = Editor(tmp_path / "ed", write="Prefers 4-space indents\n")
    code, shown = on_pty([*sock(d), "edit", *UG, "spaces"], env_with(EDITOR=editor.command), answers=[b"n"])
    assert code == 1 and error_line(shown).startswith("error: WRITE_DENIED: "), shown
    assert entries(d) == [(tabs, "Prefers spaces", 2)]


def test_edit_with_tags_and_json(daemon: Any, tmp_path: Path) -> None:
    [tabs] = add(daemon, "Prefers tabs")
    # the text as it was, new tags: a change all the same
    code, shown = on_pty([*sock(daemon), "--json", "edit", *UG, "--tag", "style", "tabs"], env_with(EDITOR="true"))
    assert code == 0, shown
    result = json.loads(shown)
    assert (result["entry"]["id"], result["entry"]["tags"], result["previous"]["tags"]) == (tabs, ["style"], [])
    # no change at all: with --json, what the entry is
    code, shown = on_pty([*sock(daemon), "--json", "edit", *UG, "--tag", "style", "tabs"], env_with(EDITOR="true"))
    assert code == 0, shown
    assert json.loads(shown)["changed"] is False and json.loads(shown)["entry"]["version"] == 2


def test_the_edit_lands_on_the_entry_that_was_opened(daemon: Any, tmp_path: Path) -> None:
    """Another entry with the same words added while the editor is open: MATCH now finds two,
    the entry's id still one."""
    [tabs] = add(daemon, "Prefers tabs")
    other = {"track": "user", "scope": "user-global", "text": "Also tabs"}
    editor = Editor(tmp_path / "ed", write="Prefers spaces\n", socket=str(daemon.socket_path),
                    meanwhile=["add", other])
    code, shown = on_pty([*sock(daemon), "edit", *UG, "tabs"], env_with(EDITOR=editor.command))
    assert code == 0, shown
    assert [(t, v) for _, t, v in entries(daemon)] == [("Prefers spaces", 2), ("Also tabs", 1)]
    assert entries(daemon)[0][0] == tabs


def test_ctrl_c_in_the_editor_is_the_editors(daemon: Any, tmp_path: Path) -> None:
    """The terminal sends Ctrl-C to memoryctl too: it waits on, as git does."""
    [tabs] = add(daemon, "Prefers tabs")
    editor = Editor(tmp_path / "ed", write="Prefers spaces\n", wait=True)
    code, shown = on_pty([*sock(daemon), "edit", *UG, "tabs"], env_with(EDITOR=editor.command),
                         steps=[(b"editor: waiting", b"\x03"), (b"^C", b"saved\n")])
    assert code == 0, shown
    assert editor.log()["interrupted"] is True
    assert entries(daemon) == [(tabs, "Prefers spaces", 2)]


# --- edits that write nothing ------------------------------------------------------------


def test_unchanged_text_writes_nothing(daemon: Any, tmp_path: Path) -> None:
    [tabs] = add(daemon, "Prefers tabs")
    before = store(daemon)
    for editor in ("true", Editor(tmp_path / "ed", write="  Prefers tabs\n\n").command):  # as stored, once trimmed
        code, shown = on_pty([*sock(daemon), "edit", *UG, "tabs"], env_with(EDITOR=editor))
        assert (code, shown) == (0, f"no change: {tabs[:8]} is as it was; nothing was written\n")
    assert store(daemon) == before


def test_an_empty_text_is_refused_naming_remove(daemon: Any, tmp_path: Path) -> None:
    [tabs] = add(daemon, "Prefers tabs")
    before = store(daemon)
    editor = Editor(tmp_path / "ed", write=" \n\n")
    code, shown = on_pty([*sock(daemon), "edit", *UG, "tabs"], env_with(EDITOR=editor.command))
    assert code == 2
    assert error_line(shown) == ("error: USAGE: the edited text is empty; the entry is unchanged: to delete it, run "
                                 f"memoryctl remove --track user --scope user-global --id {tabs[:8]}")
    assert store(daemon) == before


def test_an_editor_that_fails_changes_nothing(daemon: Any, tmp_path: Path) -> None:
    add(daemon, "Prefers tabs")
    before = store(daemon)
    editor = Editor(tmp_path / "ed", write="Prefers spaces\n", exit=3)  # it saved, then failed
    code, shown = on_pty([*sock(daemon), "edit", *UG, "tabs"], env_with(EDITOR=editor.command))
    assert code == 2
    assert error_line(shown) == (f"error: USAGE: the editor '{editor.command}' (from $EDITOR) exited with status 3; "
                                 "the entry is unchanged: fix the editor or set $VISUAL or $EDITOR to another one, then "
                                 "run memoryctl edit again")
    assert not os.path.lexists(editor.log()["path"])
    # $VISUAL comes before $EDITOR
    code, shown = on_pty([*sock(daemon), "edit", *UG, "tabs"], env_with(VISUAL="false", EDITOR="true"))
    assert code == 2
    assert error_line(shown).startswith("error: USAGE: the editor 'false' (from $VISUAL) exited with status 1; ")
    assert store(daemon) == before


def test_edit_needs_a_terminal(daemon: Any, tmp_path: Path) -> None:
    add(daemon, "Prefers tabs")
    before = store(daemon)
    editor = Editor(tmp_path / "ed", write="Prefers spaces\n")
    r = subprocess.run([*MEMORYCTL, *sock(daemon), "--yes", "edit", *UG, "tabs"], env=env_with(EDITOR=editor.command),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, start_new_session=True)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("error: USAGE: edit needs a terminal: it opens an editor ($VISUAL, $EDITOR or vi) on the "
                        "entry's text; without one, use memoryctl replace\n")
    assert not editor.ran()
    assert store(daemon) == before


def test_a_match_that_finds_no_one_entry_is_refused_as_replace_refuses_it(daemon: Any, tmp_path: Path) -> None:
    first, _ = add(daemon, "Prefers tabs", "Tabs in Makefiles")
    before = store(daemon)
    editor = Editor(tmp_path / "ed", write="Prefers spaces\n")
    # the daemon's refusals of a replace, word for word
    for named in (["tabs"], ["spaces"], ["--id", first[:8] + "0"], ["   "]):
        code, shown = on_pty([*sock(daemon), "edit", *UG, *named], env_with(EDITOR=editor.command))
        replaced = subprocess.run([*MEMORYCTL, *sock(daemon), "replace", *UG, *named, "Prefers spaces"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert (code, replaced.returncode) == (1, 1), (named, shown, replaced.stderr)
        assert error_line(shown) == error_line(replaced.stderr), named
    assert error_line(shown) == "error: INVALID_INPUT: match must not be empty"
    for named, line in ((["--id", first, "tabs"], "error: USAGE: edit: give MATCH or --id, not both"),
                        ([], "error: USAGE: edit needs MATCH or --id")):
        code, shown = on_pty([*sock(daemon), "edit", *UG, *named], env_with(EDITOR=editor.command))
        assert (code, error_line(shown)) == (2, line)
    assert not editor.ran()
    assert store(daemon) == before


@pytest.mark.parametrize(("meanwhile", "message", "left"), [
    ("replace", "the entry changed while it was being edited (version 1 is now version 2); your text was not saved: "
                "run memoryctl edit again to edit its new text", [("Prefers tabs, always", 2)]),
    ("remove", "the entry was removed while it was being edited; your text was not saved: add it again with "
               "memoryctl add", []),
])
def test_an_entry_that_changed_while_the_editor_was_open_is_left_alone(
        daemon: Any, tmp_path: Path, meanwhile: str, message: str, left: list[tuple[str, int]]) -> None:
    [tabs] = add(daemon, "Prefers tabs")
    target = {"track": "user", "scope": "user-global", "id": tabs}
    if meanwhile == "replace":
        target["text"] = "Prefers tabs, always"
    editor = Editor(tmp_path / "ed", write="Prefers spaces\n", socket=str(daemon.socket_path),
                    meanwhile=[meanwhile, target])
    code, shown = on_pty([*sock(daemon), "edit", *UG, "tabs"], env_with(EDITOR=editor.command))
    assert code == 1
    assert error_line(shown) == f"error: ENTRY_NOT_FOUND: {message}"
    assert "memoryctl: your edited text, not saved:\n  | Prefers spaces\n" in shown  # nothing typed is lost
    assert [(t, v) for _, t, v in entries(daemon)] == left
