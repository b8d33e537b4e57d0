"""memoryctl's approval prompt (render.approval_request): everything a human needs to
decide, a large seed kept readable, and no memory text that can pass for a prompt line."""

from __future__ import annotations

import unicodedata

import pytest
from memoryd_client.render import GUTTER, approval_request
from memoryd_protocol import types as T

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


def test_add_shows_where_it_lands_and_who_asked() -> None:
    assert approval_request(asked()) == "\n".join([
        "memoryd asks to approve a write:",
        "  action:  add",
        "  layer:   agent/workspace",
        "           workspace: /home/u/proj",
        "           agent:     coder",
        "           tags:      ci",
        "  source:  claude",
        "  session: s-1",
        "  client:  harness 1.2",
        "  process: pid 4242 (/usr/bin/node)",
        "  id:      a5ce79ce-e74e-4435-8d88-b4d64e70de0a",
        "  payload:",
        "  | Run make check",
    ])


def test_shared_layer_no_tags_and_partial_origin() -> None:
    shown = approval_request(asked(track="user", scope="user-global", workspace_key="", agent_key="", tags=[],
                                   origin=T.ApprovalOrigin(pid=7)))
    assert "           workspace: (none: every workspace)\n           agent:     (shared: every agent)\n" \
           "           tags:      -\n" in shown
    assert "  client:  (did not name itself)\n  process: pid 7\n" in shown
    assert "  client:  (unknown)\n  id:" in approval_request(asked(origin=None))
    # a tag with a comma would read as two tags: then they are shown as a list
    assert "tags:      [\"a, b\",\"c\"]" in approval_request(asked(tags=["a, b", "c"]))
    # an older daemon without the new fields: the lines are left out, nothing is invented
    old = approval_request(asked(workspace_key=None, agent_key=None, tags=None))
    assert "workspace:" not in old and "agent:" not in old and "tags:" not in old


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
    assert lines[:9] == [
        "memoryd asks to approve a write:",
        "  action:  seed (300 entries)",
        "  layer:   batch/batch",
        "  source:  claude",
        "  session: s-1",
        "  client:  harness 1.2",
        "  process: pid 4242 (/usr/bin/node)",
        "  id:      a5ce79ce-e74e-4435-8d88-b4d64e70de0a",
        "  summary: 300 entries, 2370 chars, in 3 layers",
    ]
    assert lines[9:13] == [
        "    LAYER              WORKSPACE     AGENT     ENTRIES  CHARS",
        "    user/user-global   -             (shared)  100      690",
        "    agent/user-global  -             (shared)  50       290",
        "    agent/workspace    /home/u/proj  coder     150      1390",
    ]
    assert lines[13] == "  entries (first 20 of 300):"
    assert lines[14:16] == ['  [1] user/user-global  workspace -  agent (shared)  tags -', "  | fact 0"]
    assert lines[-3:] == ["  [20] user/user-global  workspace -  agent (shared)  tags -", "  | fact 19",
                          "  … and 280 more entries (not shown)"]
    assert len(lines) == 14 + 2 * 20 + 1
    assert "(payload)" not in shown  # the entries replace the one-line-per-entry payload


def test_seed_entry_headers_and_small_batches() -> None:
    shown = approval_request(seed([entry("x", "agent", "workspace", "/srv/a b", "ops", ["deploy"])]))
    assert '  [1] agent/workspace  workspace "/srv/a b"  agent "ops"  tags deploy\n  | x' in shown
    assert "  entries:\n" in shown and "more" not in shown
    assert "  summary: 1 entry, 1 chars, in 1 layer\n" in shown
    many = approval_request(seed([entry(str(n)) for n in range(21)]))
    assert many.endswith("  | 19\n  … and 1 more entry (not shown)")
    assert approval_request(seed([entry(str(n)) for n in range(5)]), shown=2).endswith(
        "  … and 3 more entries (not shown)")


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
        a = asked(action="replace", text=f"from:\nold\n\nto:\n{text}")
    elif where == "seed":
        a = seed([entry("first"), entry(text, tags=["x\nApprove? [y/N] y"])])
    else:
        a = asked(workspace_key=f"/p\n{FORGE}", agent_key=f"a\n{FORGE}", tags=[f"t\n{FORGE}"], session_id=FORGE,
                  source=FORGE, origin=T.ApprovalOrigin(name=FORGE, version=FORGE, pid=1, exe=FORGE))
    lines = _prompt_lines(approval_request(a))
    assert [ln for ln in lines if ln.startswith("  action:")] == [lines[1]]
    assert not any(ln.startswith("Approve?") for ln in lines)
    for ln in lines:
        if "Approve? [y/N] y" in ln or "action:  add" in ln[3:]:
            assert ln.startswith(GUTTER) or "\\n" in ln, ln  # inside the gutter, or escaped in one line
    if where != "keys":
        # each line of the text is its own gutter line; the other breaks are escapes
        assert "  | Approve? [y/N] y" in lines and "  |   action:  add" in lines
        assert "  | a\\x0db\\u2028c\\u2029d\\x85e\\x0bf\\x0cg\\x1ch\\x1di\\x1ej" in lines


def _cells(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WFA" else 8 if ch == "\t" else 1 for ch in line)


@pytest.mark.parametrize("filler", ["x", "中", "\t", "é"])
def test_long_lines_are_cut_under_the_gutter_instead_of_wrapping(filler: str) -> None:
    forged = filler * 100 + "Approve? [y/N] y"
    a = asked(text=forged, session_id=forged, workspace_key="/" + forged)
    lines = _prompt_lines(approval_request(a, width=40))
    assert all(_cells(ln) <= 39 for ln in lines), [ln for ln in lines if _cells(ln) > 39]
    labels = ("memoryd asks", "  action:", "  layer:", "           ", "  source:", "  session:", "  client:",
              "  process:", "  id:", "  payload:", GUTTER)
    assert all(ln.startswith(labels) for ln in lines), lines
    # nothing is lost: the pieces put back together are the text
    gutter = [ln[len(GUTTER):] for ln in lines[lines.index("  payload:") + 1:]]
    assert "".join(gutter) == forged
    assert approval_request(a).count("\n") < len(lines) - 1  # without a width, nothing is cut
