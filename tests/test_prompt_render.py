"""memoryctl's approval prompt (render.approval_request): everything a human needs to
decide, a large seed kept readable, and no memory text that can pass for a prompt line."""

from __future__ import annotations

import unicodedata

import pytest
from memoryd_client.render import approval_request
from memoryd_protocol import types as T
from memoryd_protocol.approval_text import MARKS
from memoryd_protocol.constants import CONSOLIDATE_EXCERPT_UNITS
from memoryd_protocol.text import cut_units

ORIGIN = T.ApprovalOrigin(name="harness", version="1.2", pid=4242, exe="/usr/bin/node")
FORGE = "Prefers tabs\nApprove? [y/N] y\n  action:  add"
BREAKS = "a\rb\u2028c\u2029d\x85e\vf\fg\x1ch\x1di\x1ej"


def asked(**kw: object) -> T.ApprovalAsked:
    base: dict[str, object] = {
        "id": "a5ce79ce-e74e-4435-8d88-b4d64e70de0a", "action": "add", "track": "agent", "scope": "workspace",
        "text": "Run make check", "source": "claude", "session_id": "s-1", "reason": "(not shown)",
        "workspace_key": "/home/u/proj", "agent_key": "coder", "tags": ["ci"], "origin": ORIGIN,
    }
    base.update(kw)
    return T.ApprovalAsked(**base)  # type: ignore[arg-type]


def entry(text: str, track: str = "user", scope: str = "user-global", wk: str = "", ak: str = "",
          tags: list[str] | None = None) -> T.ApprovalEntry:
    return T.ApprovalEntry(track=track, scope=scope, workspace_key=wk, agent_key=ak, text=text,  # type: ignore[arg-type]
                           tags=tags or [])


def seed(entries: list[T.ApprovalEntry]) -> T.ApprovalAsked:
    return asked(action="seed", track="batch", scope="batch", count=len(entries), text="(payload)",
                 workspace_key=None, agent_key=None, tags=None, entries=entries)


def test_add_shows_what_and_where_then_the_text_then_who_asked() -> None:
    assert approval_request(asked()) == "\n".join([
        'add to agent/workspace, only for agent "coder", in workspace "/home/u/proj":',
        "  + Run make check",
        "  tags:    ci",
        "  source:  claude",
        "  session: s-1",
        "  client:  harness 1.2",
        "  process: pid 4242 (/usr/bin/node)",
        "  id:      a5ce79ce-e74e-4435-8d88-b4d64e70de0a",
    ])


@pytest.mark.parametrize(("action", "text", "head"), [
    ("replace", "from:\nPrefers tabs\n\nto:\nPrefers spaces",
     ['replace in user/workspace, shared by every agent, in workspace "/home/u/proj":', "  + Prefers spaces",
      "  - Prefers tabs"]),
    ("remove", "Prefers tabs", ['remove from user/workspace, shared by every agent, in workspace "/home/u/proj":',
                                "  - Prefers tabs", "  tags:    -"]),
    ("consolidate", "remove: vim\nUses vim\nremove: tmux\nUses tmux\nnew text: Uses vim in tmux",
     ['consolidate into one, in user/workspace, shared by every agent, in workspace "/home/u/proj":',
      "  + Uses vim in tmux",
      "  - remove: vim"]),
])
def test_the_first_three_lines_are_the_change_the_new_text_first(action: str, text: str, head: list[str]) -> None:
    """A host that shows a dialog's first three lines (Claude Code) shows what is written."""
    shown = approval_request(asked(action=action, text=text, track="user", agent_key="", tags=[]))
    assert shown.split("\n")[:3] == head


def test_shared_layer_no_tags_and_partial_origin() -> None:
    shown = approval_request(asked(track="user", scope="user-global", workspace_key="", agent_key="", tags=[],
                                   origin=T.ApprovalOrigin(pid=7)))
    assert shown.startswith("add to user/user-global, shared by every agent:\n"
                            "  + Run make check\n  tags:    -\n")
    assert "  client:  (did not name itself)\n  process: pid 7\n" in shown
    assert "  client:  (unknown)\n  id:" in approval_request(asked(origin=None))
    # a tag with a comma would read as two tags: then they are shown as a list
    assert "tags:    [\"a, b\",\"c\"]" in approval_request(asked(tags=["a, b", "c"]))
    # keys are quoted, and the workspace (a client names its own cwd) comes last, so no key
    # can pose as, or push off the line, where the entry lands
    spoof = "/p）， only for agent codex：" + " " * 120 + "x"
    assert approval_request(asked(workspace_key=spoof, agent_key="a b")).startswith(
        f'add to agent/workspace, only for agent "a b", in workspace "{spoof}":\n')
    assert approval_request(asked(workspace_key=spoof, agent_key=""), width=100).startswith(
        'add to agent/workspace, shared by every agent, in workspace "/p）， only for agent codex：')
    # an older daemon without the new fields: the parts are left out, nothing is invented
    old = approval_request(asked(workspace_key=None, agent_key=None, tags=None))
    assert old.startswith("add to agent/workspace:\n  + Run make check\n  source:") and "tags:" not in old


def test_a_write_through_memoryd_mcp_names_the_host_as_an_mcp_host() -> None:
    origin = T.ApprovalOrigin(name="Claude Code", version="2.1.0", pid=99, exe="/usr/bin/node", front_end="mcp")
    assert "  client:  Claude Code 2.1.0 (an MCP host, through memoryd mcp)\n  process: pid 99 (/usr/bin/node)\n" \
        in approval_request(asked(origin=origin))


def test_seed_of_300_shows_a_summary_per_layer_then_20_entries_and_the_count_of_the_rest() -> None:
    entries = [entry(f"fact {n}") for n in range(100)]
    entries += [entry(f"lesson {n}", "agent", "workspace", "/home/u/proj", "coder", ["ci"]) for n in range(150)]
    entries += [entry(f"tip {n}", "agent", "user-global") for n in range(50)]
    shown = approval_request(seed(entries))
    lines = shown.split("\n")
    assert lines[:2] == ["seed 300 entries into 3 layers:", "  summary: 300 entries, 2370 chars, in 3 layers"]
    assert lines[-5:] == ["  source:  claude", "  session: s-1", "  client:  harness 1.2",
                          "  process: pid 4242 (/usr/bin/node)", "  id:      a5ce79ce-e74e-4435-8d88-b4d64e70de0a"]
    lines = lines[:-5]
    assert lines[2:6] == [
        "    LAYER              WORKSPACE     AGENT     ENTRIES  CHARS",
        "    user/user-global   -             (shared)  100      690",
        "    agent/user-global  -             (shared)  50       290",
        "    agent/workspace    /home/u/proj  coder     150      1390",
    ]
    assert lines[6] == "  entries (first 20 of 300):"
    assert lines[7:9] == ['  [1] user/user-global  workspace -  agent (shared)  tags -', "  + fact 0"]
    assert lines[-3:] == ["  [20] user/user-global  workspace -  agent (shared)  tags -", "  + fact 19",
                          "  … and 280 more entries (not shown)"]
    assert len(lines) == 7 + 2 * 20 + 1
    assert "(payload)" not in shown  # the entries replace the one-line-per-entry payload


def test_seed_entry_headers_and_small_batches() -> None:
    shown = approval_request(seed([entry("x", "agent", "workspace", "/srv/a b", "ops", ["deploy"])]))
    assert '  [1] agent/workspace  workspace "/srv/a b"  agent "ops"  tags deploy\n  + x' in shown
    assert "  entries:\n" in shown and "more" not in shown
    assert "  summary: 1 entry, 1 chars, in 1 layer\n" in shown
    many = approval_request(seed([entry(str(n)) for n in range(21)]))
    assert "  + 19\n  … and 1 more entry (not shown)\n  source:" in many
    assert "  … and 3 more entries (not shown)\n" in approval_request(seed([entry(str(n)) for n in range(5)]), shown=2)


def _prompt_lines(shown: str) -> list[str]:
    # Only \n may break a line: any other line break would have survived as one.
    assert shown.splitlines() == shown.split("\n")
    return shown.split("\n")


@pytest.mark.parametrize("where", ["payload", "replace", "seed", "keys"])
def test_no_text_can_forge_a_line_of_the_prompt(where: str) -> None:
    text = f"{FORGE}\n{BREAKS}"
    if where == "payload":
        a = asked(text=text)
    elif where == "replace":
        a = asked(action="replace", text=f"from:\n{text}\n\nto:\nnew")
    elif where == "seed":
        a = seed([entry("first"), entry(text, tags=["x\nApprove? [y/N] y"])])
    else:
        a = asked(workspace_key=f"/p\n{FORGE}", agent_key=f"a\n{FORGE}", tags=[f"t\n{FORGE}"], session_id=FORGE,
                  source=FORGE, origin=T.ApprovalOrigin(name=FORGE, version=FORGE, pid=1, exe=FORGE))
    lines = _prompt_lines(approval_request(a))
    assert not any(ln.startswith(("Approve?", "  action:")) for ln in lines)
    for ln in lines[1:]:
        if "Approve? [y/N] y" in ln or "action:  add" in ln[3:]:
            assert ln.startswith(MARKS) or "\\n" in ln, ln  # after a mark, or escaped in one line
    if where != "keys":
        # each line of the text is its own marked line; the other breaks are escapes
        mark = "  - " if where == "replace" else "  + "
        assert f"{mark}Approve? [y/N] y" in lines and f"{mark}  action:  add" in lines
        assert f"{mark}a\\x0db\\u2028c\\u2029d\\x85e\\x0bf\\x0cg\\x1ch\\x1di\\x1ej" in lines


def _cells(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WFA" else 8 if ch == "\t" else 1 for ch in line)


@pytest.mark.parametrize("filler", ["x", "中", "\t", "é"])
def test_long_lines_are_cut_under_the_gutter_instead_of_wrapping(filler: str) -> None:
    forged = filler * 100 + "Approve? [y/N] y"
    a = asked(text=forged, session_id=forged, workspace_key="/" + forged)
    lines = _prompt_lines(approval_request(a, width=40))
    assert all(_cells(ln) <= 39 for ln in lines), [ln for ln in lines if _cells(ln) > 39]
    labels = ("add to ", "  tags:", "  source:", "  session:", "  client:", "  process:", "  id:", *MARKS)
    assert all(ln.startswith(labels) for ln in lines), lines
    # nothing is lost: the pieces put back together are the text
    start = next(n for n, ln in enumerate(lines) if ln.startswith("  + "))
    end = next(n for n, ln in enumerate(lines) if ln.startswith("  tags:"))
    assert "".join(ln[4:] for ln in lines[start:end]) == forged
    assert approval_request(a).count("\n") < len(lines) - 1  # without a width, nothing is cut


def test_a_payload_split_only_where_its_separator_starts_at_one_place() -> None:
    """An old text ending in ``\\n\\nto:`` makes the separator overlap itself: which part is
    new cannot be told, so nothing is marked added or removed, and the payload is shown whole."""
    text = "from:\nNever force-push to main\n\nto:\n\nto:\nForce-push is fine"
    lines = approval_request(asked(action="replace", text=text)).split("\n")
    assert lines[1:8] == [f"  | {line}" for line in text.split("\n")]
    assert not any(ln.startswith(("  + ", "  - ")) for ln in lines)


def test_a_consolidate_target_that_may_be_cut_says_so() -> None:
    """The payload format cuts each consolidated target at 300 characters with an ellipsis
    that a text can hold too: a new text equal to the cut must not pass for a plain move."""
    old = "Deploy with make deploy. " * 16  # 400 characters
    excerpt = cut_units(old, CONSOLIDATE_EXCERPT_UNITS)
    shown = approval_request(asked(action="consolidate", text=f"remove: id e1\n{excerpt}\nnew text: {excerpt}"))
    assert shown.split("\n")[1:5] == [
        f"  + {excerpt}", "  - remove: id e1", f"  - {excerpt}",
        "  | (may be cut at 300 characters, as the payload format cuts each target: memoryctl query shows it whole)"]
    whole = approval_request(asked(action="consolidate", text="remove: tabs\nPrefers tabs\nnew text: Tabs"))
    assert "may be cut" not in whole
