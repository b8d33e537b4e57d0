"""Import/export adapters (memoryd_protocol.adapters) and the daemon's adapter registry.

Golden files live in tests/golden/adapters/<adapter-id>/: every ``<name>.md`` (the payload
is the file's text, byte-exact) or ``<name>.json`` (the payload is the decoded JSON) has a
``<name>.expected.json`` holding either ``{"entries": [...]}`` (EntryInput rows, camelCase)
or ``{"error": {"code": ..., "details": {...}}}``. ``export/entries.json`` holds stored
entries; ``export/<adapter-id>.expected.{json,md}`` the documents they export to.
Set MEMORYD_UPDATE_GOLDEN=1 to rewrite the expected files (then review the diff).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memoryd_protocol.adapters import (
    ADAPTER_ID_PATTERN,
    Adapter,
    AdapterBase,
    adapt_payload,
    builtin_adapters,
    export_entries,
    fit_tag,
    get_adapter,
)
from memoryd_protocol.constants import GRID, MAX_TAG_UNITS
from memoryd_protocol.errors import AdapterNotFound, AdapterPayload, ProtocolError
from memoryd_protocol.text import normalize_agent_key, normalize_workspace_key, utf16_len
from memoryd_protocol.types import AdapterInfo, Entry, EntryInput

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "adapters"
UPDATE = os.environ.get("MEMORYD_UPDATE_GOLDEN") == "1"
BUILTIN_IDS = ["mem0", "hermes-memory-md", "claude-code-memory-md"]
MARKDOWN_IDS = ["hermes-memory-md", "claude-code-memory-md"]


def _registry_module() -> ModuleType:
    """memoryd.adapter_registry; loaded from its file while the daemon package is not
    importable yet (it only imports memoryd_protocol)."""
    try:
        return importlib.import_module("memoryd.adapter_registry")
    except ImportError:
        path = ROOT / "daemon" / "memoryd" / "adapter_registry.py"
        spec = importlib.util.spec_from_file_location("_memoryd_adapter_registry_under_test", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


registry_mod = _registry_module()


# --- golden files ------------------------------------------------------------------------


def _golden_cases() -> list[Any]:
    cases = []
    for adapter_id in BUILTIN_IDS:
        for path in sorted((GOLDEN / adapter_id).iterdir()):
            if ".expected." in path.name or path.suffix not in (".md", ".json"):
                continue
            cases.append(pytest.param(adapter_id, path, id=f"{adapter_id}/{path.name}"))
    return cases


def _payload(path: Path) -> Any:
    raw = path.read_bytes().decode("utf-8")  # not read_text: CRLF must reach the adapter as-is
    return raw if path.suffix == ".md" else json.loads(raw)


def _outcome(adapter: Adapter, payload: Any) -> dict[str, Any]:
    try:
        entries = adapter.adapt(payload)
    except ProtocolError as exc:
        return {"error": {"code": exc.code, "details": exc.details}}
    return {"entries": msgspec.to_builtins(entries)}


def _check_golden(expected_path: Path, actual: str) -> None:
    if UPDATE:
        expected_path.write_bytes(actual.encode("utf-8"))
    assert expected_path.exists(), f"missing golden file {expected_path} (run with MEMORYD_UPDATE_GOLDEN=1)"
    assert actual == expected_path.read_bytes().decode("utf-8")


@pytest.mark.parametrize(("adapter_id", "path"), _golden_cases())
def test_import_golden(adapter_id: str, path: Path) -> None:
    adapter = builtin_adapters()[adapter_id]
    outcome = _outcome(adapter, _payload(path))
    expected_path = path.with_name(path.stem + ".expected.json")
    _check_golden(expected_path, json.dumps(outcome, indent=2, ensure_ascii=False) + "\n")
    if "error" in outcome:
        # every refusal is ADAPTER_PAYLOAD naming the adapter; markdown line errors say the line
        assert outcome["error"]["code"] == "ADAPTER_PAYLOAD"
        assert outcome["error"]["details"]["adapterId"] == adapter_id
        with pytest.raises(AdapterPayload) as info:
            adapter.adapt(_payload(path))
        if "line" in outcome["error"]["details"]:
            assert f"line {outcome['error']['details']['line']}" in info.value.message
        if "index" in outcome["error"]["details"]:
            assert f"fact {outcome['error']['details']['index']}" in info.value.message
    else:
        # what the adapter returns already passes the daemon's contract check unchanged
        assert adapt_payload(adapter, _payload(path)) == adapter.adapt(_payload(path))


def _export_entries() -> list[Entry]:
    return msgspec.json.decode((GOLDEN / "export" / "entries.json").read_bytes(), type=list[Entry])


@pytest.mark.parametrize("adapter_id", BUILTIN_IDS)
def test_export_golden(adapter_id: str) -> None:
    adapter = builtin_adapters()[adapter_id]
    document = export_entries(adapter, _export_entries())
    if adapter_id == "mem0":
        _check_golden(
            GOLDEN / "export" / "mem0.expected.json", json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        )
    else:
        assert set(document) == {"plugin", "text"} and document["plugin"] == adapter_id
        _check_golden(GOLDEN / "export" / f"{adapter_id}.expected.md", document["text"])


# --- markdown specifics ------------------------------------------------------------------


def _rows(entries: list[EntryInput]) -> list[tuple[str, str, str, list[str] | None]]:
    return [(e.track, e.scope, e.text, e.tags) for e in entries]


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
def test_markdown_headings_of_every_level_name_sections(adapter_id: str) -> None:
    """In a document with placement headings (memoryd's own); elsewhere only '## ' is one."""
    doc = '## memoryd: agent ""\n## user/user-global\n# One\n- a\n## Two\n* b\n### Three\n- c\n#### Four ####\n- d\n## Back\n- e\n'
    entries = builtin_adapters()[adapter_id].adapt(doc)
    assert [(e.text, e.tags) for e in entries] == [
        ("a", ["One"]),
        ("b", ["Two"]),
        ("c", ["Three"]),
        ("d", ["Four"]),
        ("e", ["Back"]),
    ]
    assert all(e.source == adapter_id for e in entries)


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
def test_markdown_payload_forms_and_line_endings(adapter_id: str) -> None:
    adapter = builtin_adapters()[adapter_id]
    lf = "## Prefs\n- a\n* b\n"
    expected = _rows(adapter.adapt(lf))
    assert len(expected) == 2
    assert _rows(adapter.adapt({"text": lf})) == expected
    assert _rows(adapter.adapt(lf.replace("\n", "\r\n"))) == expected
    assert _rows(adapter.adapt("\ufeff" + lf)) == expected


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
def test_markdown_grid_heading_places_entries_and_is_not_a_tag(adapter_id: str) -> None:
    """In memoryd's own documents (they carry placement headings); in any other the reference
    reads a '## agent/workspace' heading as a section name, and so does memoryd."""
    doc = '## memoryd: agent "a"\n## agent/workspace\n- w\n### Tools\n- t\n## Other\n- o\n'
    adapter = builtin_adapters()[adapter_id]
    assert _rows(adapter.adapt(doc)) == [
        ("agent", "workspace", "w", []),
        ("agent", "workspace", "t", ["Tools"]),
        ("user", "user-global", "o", ["Other"]),
    ]
    assert _rows(adapter.adapt("## agent/workspace\n- w\n")) == [("user", "user-global", "w", ["agent/workspace"])]


def _entry(track: str, scope: str, text: str, workspace_key: str = "", agent_key: str = "") -> Entry:
    return Entry(id=text, track=track, scope=scope, workspace_key=workspace_key, agent_key=agent_key,
                 text=text, source="s", tags=[], version=1, created_at=0, updated_at=0, last_recalled=None,
                 recall_count=0, session_id=None)


def _placed(entries: list[EntryInput]) -> list[tuple[str, str, str, list[str] | None, str | None, str | None]]:
    return [(e.track, e.scope, e.text, e.tags, e.workspace_key, e.agent_key) for e in entries]


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
def test_markdown_placement_heading_names_the_layer_of_the_next_cell(adapter_id: str) -> None:
    doc = (
        '## memoryd: workspace "/home/u/proj", agent "coder"\n## agent/workspace\n- a\n### Tools\n- b\n'
        "## agent/workspace\n- c\n"  # a cell heading without one: the importing session's layer, as before
        '## memoryd: agent "reviewer"\n\n## user/user-global\n- d\n'  # blank lines between are fine
        '# memoryd: agent "x", workspace "/srv/r"\n## user/workspace\n- e\n'  # either order, any level
        "## memoryd: architecture\n- f\n"  # ordinary headings, so tags
        "## memoryd: workspace setup\n- g\n"
        '## Memoryd: agent "y"\n- h\n'
    )
    adapter = builtin_adapters()[adapter_id]
    default = ("user", "user-global")
    assert _placed(adapter.adapt(doc)) == [
        ("agent", "workspace", "a", [], "/home/u/proj", "coder"),
        ("agent", "workspace", "b", ["Tools"], "/home/u/proj", "coder"),
        ("agent", "workspace", "c", [], None, None),
        ("user", "user-global", "d", [], None, "reviewer"),
        ("user", "workspace", "e", [], "/srv/r", "x"),
        (*default, "f", ["memoryd: architecture"], None, None),
        (*default, "g", ["memoryd: workspace setup"], None, None),
        (*default, "h", ['Memoryd: agent "y"'], None, None),
    ]


def test_markdown_placement_values_are_json_strings_normalized_like_session_keys() -> None:
    doc = (
        '## memoryd: workspace "/home/u/a b/../c d/", agent "  Coder  "\n## agent/workspace\n- x\n'
        '## memoryd: workspace "C:\\\\Users\\\\Ann", agent "\\"q\\" \\u00e9 #1"\n## user/workspace\n- y\n'
        '## memoryd: workspace "/srv/#1 ## x #" ##\n## user/workspace\n- z\n'  # closing hashes are not the value's
    )
    assert _placed(builtin_adapters()["claude-code-memory-md"].adapt(doc)) == [
        ("agent", "workspace", "x", [], "/home/u/c d", "coder"),
        ("user", "workspace", "y", [], "c:/users/ann", '"q" é #1'),
        ("user", "workspace", "z", [], "/srv/#1 ## x #", None),
    ]


def test_markdown_export_gives_each_layer_its_own_section() -> None:
    entries = [
        _entry("user", "user-global", "u shared"),
        _entry("user", "user-global", "u coder", agent_key="coder"),
        _entry("agent", "workspace", "b shared", workspace_key="/b"),
        _entry("agent", "workspace", "a reviewer", workspace_key="/a", agent_key="reviewer"),
        _entry("agent", "workspace", "a shared", workspace_key="/a"),
        _entry("agent", "workspace", "b shared again", workspace_key="/b"),
        _entry("user", "user-global", "u shared again"),
    ]
    for adapter_id in MARKDOWN_IDS:
        assert builtin_adapters()[adapter_id].export(entries) == {"plugin": adapter_id, "text": (
            '## memoryd: workspace "/b", agent ""\n## agent/workspace\n- b shared\n- b shared again\n\n'
            '## memoryd: workspace "/a", agent "reviewer"\n## agent/workspace\n- a reviewer\n\n'
            '## memoryd: workspace "/a", agent ""\n## agent/workspace\n- a shared\n\n'
            '## memoryd: agent ""\n## user/user-global\n- u shared\n- u shared again\n\n'
            '## memoryd: agent "coder"\n## user/user-global\n- u coder'
        )}


def test_markdown_export_quotes_keys_as_one_line_json_strings() -> None:
    workspace = '/srv/#1 "x"\\y\n\u2028\x85\x7f ü 😀'
    document = builtin_adapters()["hermes-memory-md"].export(
        [_entry("user", "workspace", "t", workspace_key=workspace, agent_key="a b #c")]
    )
    assert document == {"plugin": "hermes-memory-md", "text": (
        '## memoryd: workspace "/srv/#1 \\"x\\"\\\\y\\n\\u2028\\u0085\\u007f ü 😀", agent "a b #c"\n'
        "## user/workspace\n- t"
    )}
    (back,) = builtin_adapters()["hermes-memory-md"].adapt(document)
    assert (back.workspace_key, back.agent_key) == (workspace, "a b #c")


_CELL = "## agent/workspace\n- x\n"
_FORM = "write it as '## memoryd: workspace \"/abs/path\", agent \"name\"' (either part may be left out)"
_NOT_FOLLOWED = (": a placement heading must be followed directly by a '## <track>/<scope>' heading (such as "
                 "'## agent/workspace'); add one or remove the placement heading")


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
@pytest.mark.parametrize(
    ("doc", "line", "says"),
    [
        ('- a\n## memoryd: workspace "/a" agent "b"\n' + _CELL, 2, f" is a malformed placement heading; {_FORM}"),
        ('## memoryd: agent "a", agent "b"\n' + _CELL, 1, f" is a malformed placement heading; {_FORM}"),
        ('## memoryd: agent "a",\n' + _CELL, 1, f" is a malformed placement heading; {_FORM}"),
        ('## memoryd: workspace "/a\n' + _CELL, 1, f" is a malformed placement heading; {_FORM}"),
        ('## memoryd: agent "a\\q"\n' + _CELL, 1,
         f" is a malformed placement heading (its agent is not a valid JSON string); {_FORM}"),
        ('## memoryd: workspace "a\tb"\n' + _CELL, 1,
         f" is a malformed placement heading (its workspace is not a valid JSON string); {_FORM}"),
        ('## memoryd: workspace "proj"\n' + _CELL, 1,
         ": the placement heading's workspace is invalid (cwd must be an absolute path); correct it or remove the "
         "heading"),
        ('## memoryd: workspace "/' + "a" * 4096 + '"\n' + _CELL, 1,
         ": the placement heading's workspace is invalid (cwd (workspaceKey) longer than 4096 characters); correct "
         "it or remove the heading"),
        ('## memoryd: workspace "/a\\ud800"\n' + _CELL, 1,
         ": the placement heading's workspace is invalid (workspaceKey contains a lone UTF-16 surrogate); correct it "
         "or remove the heading"),
        ('## memoryd: workspace "/a", agent "' + "x" * 257 + '"\n' + _CELL, 1,
         ": the placement heading's agent is invalid (agentPreset (agentKey) longer than 256 characters); correct it "
         "or remove the heading"),
        ('## memoryd: agent "a\\u0007"\n' + _CELL, 1,
         ": the placement heading's agent is invalid (agentKey must not contain control characters); correct it or "
         "remove the heading"),
        ('## memoryd: workspace " "\n' + _CELL, 1,
         ": the placement heading's workspace is empty; name one or leave the workspace out"),
        ('## memoryd: workspace "/a"\n## user/user-global\n- x\n', 1,
         ": the placement heading names a workspace, but 'user/user-global' entries have none; leave the workspace "
         "out or place the entries in a workspace section"),
        ('## memoryd: agent "a"\n- x\n', 1, _NOT_FOLLOWED),
        ('## memoryd: agent "a"\n## Tools\n' + _CELL, 1, _NOT_FOLLOWED),
        ('## memoryd: agent "a"\n## memoryd: agent "b"\n' + _CELL, 1, _NOT_FOLLOWED),
        ('## memoryd: agent "a"\nprose\n' + _CELL, 1, _NOT_FOLLOWED),
        ('- x\n\n## memoryd: agent "a"\n\n', 3, _NOT_FOLLOWED),
    ],
)
def test_markdown_placement_heading_errors_name_its_line(adapter_id: str, doc: str, line: int, says: str) -> None:
    adapter = builtin_adapters()[adapter_id]
    with pytest.raises(AdapterPayload) as info:
        adapter.adapt(doc)
    assert info.value.details == {"adapterId": adapter_id, "line": line}
    assert info.value.message == f"{adapter_id}: line {line}{says}"
    with pytest.raises(AdapterPayload):
        adapt_payload(adapter, doc)  # the daemon's calling convention passes it through as is


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
def test_markdown_errors_name_the_line_with_crlf(adapter_id: str) -> None:
    doc = "## A\r\n- ok\r\n\r\n- a \ud800\r\n"
    with pytest.raises(AdapterPayload) as info:
        builtin_adapters()[adapter_id].adapt(doc)
    assert info.value.code == "ADAPTER_PAYLOAD"
    assert info.value.details == {"adapterId": adapter_id, "line": 4}
    assert "line 4" in info.value.message
    assert info.value.to_wire()["code"] == -32019


def test_hermes_refuses_prose_claude_code_keeps_it() -> None:
    doc = "## Notes\n- bullet\nprose line one\nprose line two\n"
    with pytest.raises(AdapterPayload) as info:
        builtin_adapters()["hermes-memory-md"].adapt(doc)
    assert info.value.details["line"] == 3
    entries = builtin_adapters()["claude-code-memory-md"].adapt(doc)
    # as the reference reads it: a bullet is one line, the prose after it a paragraph
    assert [e.text for e in entries] == ["bullet", "prose line one prose line two"]
    entries = builtin_adapters()["claude-code-memory-md"].adapt("## Notes\n- bullet\n\nprose one\n  prose two\n")
    assert [e.text for e in entries] == ["bullet", "prose one prose two"]


def test_claude_code_fence_hides_headings_and_bullets() -> None:
    """In memoryd's own documents; elsewhere a fence is text, as the reference reads it."""
    doc = "## Cmds\n```sh\n# not a heading\n- not a bullet\n\n```\n- real bullet\n"
    entries = builtin_adapters()["claude-code-memory-md"].adapt('## memoryd: agent "a"\n## agent/user-global\n' + doc)
    assert _rows(entries) == [
        ("user", "user-global", "```sh\n# not a heading\n- not a bullet\n\n```", ["Cmds"]),
        ("user", "user-global", "real bullet", ["Cmds"]),
    ]
    assert [e.text for e in builtin_adapters()["claude-code-memory-md"].adapt(doc)] == [
        "```sh # not a heading", "not a bullet", "```", "real bullet"]


def test_long_heading_is_cut_to_a_valid_tag() -> None:
    heading = "Everything about the build system and its many quirks"
    (entry,) = builtin_adapters()["hermes-memory-md"].adapt(f"## {heading}\n- x\n")
    assert entry.tags is not None
    (tag,) = entry.tags
    assert utf16_len(tag) == MAX_TAG_UNITS
    assert tag.endswith("…")
    assert heading.startswith(tag[:-1])


@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=80))
def test_fit_tag_always_yields_a_protocol_tag(label: str) -> None:
    from memoryd_protocol.text import normalize_tags

    tag = fit_tag(label)
    if tag is not None:
        assert normalize_tags([tag]) == [tag]  # trimmed, ≤32 units, no control characters


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
@pytest.mark.parametrize("payload", [42, None, ["- a"], {"text": 1}, {"body": "- a"}, b"- a"])
def test_markdown_bad_payload_types(adapter_id: str, payload: Any) -> None:
    with pytest.raises(AdapterPayload) as info:
        builtin_adapters()[adapter_id].adapt(payload)
    assert info.value.details["adapterId"] == adapter_id


# --- mem0 specifics ----------------------------------------------------------------------


def test_mem0_list_and_facts_forms_agree() -> None:
    adapter = builtin_adapters()["mem0"]
    facts = [{"memory": "Likes tea", "metadata": {"category": "food", "tags": ["drink", "food"]}}]
    assert adapter.adapt(facts) == adapter.adapt({"facts": facts}) == adapter.adapt({"results": facts})
    (entry,) = adapter.adapt(facts)
    assert (entry.track, entry.scope, entry.text, entry.tags, entry.source) == (
        "user",
        "user-global",
        "Likes tea",
        ["food", "drink"],
        "mem0",
    )


@pytest.mark.parametrize(
    "payload", [{"messages": [{"role": "user", "content": "hi"}]}, [{"role": "user", "content": "hi"}]]
)
def test_mem0_refuses_a_transcript(payload: Any) -> None:
    with pytest.raises(AdapterPayload, match="transcript") as info:
        builtin_adapters()["mem0"].adapt(payload)
    assert info.value.details == {"adapterId": "mem0"}


# --- round trips -------------------------------------------------------------------------

_texts = (
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60).map(str.strip).filter(bool)
)
_tags = st.lists(
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=MAX_TAG_UNITS),
    max_size=4,
    unique=True,
)


#: Stored (normalized) keys that a placement heading must carry through: ``#``, quotes,
#: backslashes, spaces, line breaks, C1 controls, U+2028, non-ASCII and a Windows drive.
_WORKSPACES = ["/w", "/home/u/my proj", "/srv/#1 ## x #", '/q/"x"\\y', "/t/\ttab\nnl\u2028\x85", "/home/ü/日本語/😀",
               "c:/users/x"]
_AGENTS = ["", "coder", "a b #c", '"q"\\', "日本\u2028x", "x" * 256]


@st.composite
def _entries(draw: st.DrawFn, odd_keys: bool = False) -> list[Entry]:
    out = []
    for i in range(draw(st.integers(min_value=0, max_value=8))):
        track, scope = draw(st.sampled_from(GRID))
        created = draw(st.integers(min_value=0, max_value=4_102_444_800_000))  # up to 2100
        workspace = draw(st.sampled_from(_WORKSPACES)) if odd_keys else "/w"
        out.append(
            Entry(
                id=f"id-{i}",
                track=track,
                scope=scope,
                workspace_key=workspace if scope == "workspace" else "",
                agent_key=draw(st.sampled_from(_AGENTS if odd_keys else ["", "coder"])),
                text=draw(_texts),
                source=draw(st.sampled_from(["dsh-memento", "memory-tool"])),
                tags=draw(_tags),
                version=1,
                created_at=created,
                updated_at=created + draw(st.integers(min_value=0, max_value=10**9)),
                last_recalled=None,
                recall_count=0,
                session_id=None,
            )
        )
    return out


def _export_order(entries: list[Entry]) -> list[Entry]:
    """The reference's section order (track/scope names sorted), then each layer in the order
    it first appears; creation order kept within a layer."""
    first: dict[tuple[str, str, str, str], int] = {}
    for n, e in enumerate(entries):
        first.setdefault((e.track, e.scope, e.workspace_key, e.agent_key), n)
    return sorted(entries, key=lambda e: (f"{e.track}/{e.scope}", first[(e.track, e.scope, e.workspace_key,
                                                                          e.agent_key)]))


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
@settings(max_examples=150)
@given(entries=_entries(odd_keys=True))
def test_markdown_export_then_adapt_round_trips(adapter_id: str, entries: list[Entry]) -> None:
    adapter = builtin_adapters()[adapter_id]
    document = adapter.export(entries)
    back = adapter.adapt(document)
    expected = [
        (e.track, e.scope, " ".join(e.text.replace("\r\n", "\n").replace("\r", "\n").split("\n")),
         e.workspace_key or None, e.agent_key)
        for e in _export_order(entries)
    ]
    assert [(e.track, e.scope, e.text, e.workspace_key, e.agent_key) for e in back] == expected
    assert all(e.tags == [] and e.source == adapter_id for e in back)
    # the same keys the daemon would store: nothing for the pipeline to normalize away
    assert all(normalize_workspace_key(e.workspace_key, {}) == e.workspace_key for e in back if e.workspace_key)
    assert all(normalize_agent_key(e.agent_key) == e.agent_key for e in back if e.agent_key)


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
@settings(max_examples=100)
@given(entries=_entries(odd_keys=True))
def test_markdown_export_stays_readable_by_the_reference_provider(adapter_id: str, entries: list[Entry]) -> None:
    """dsh-memento's markdown adapters know '## ' headings and '- ' bullets only (its hermes one
    refuses any other line) and tag a bullet with the last '## ' heading above it: an export
    still imports there as it did, every bullet tagged with its '<track>/<scope>'."""
    section = ""
    tags = []
    for line in builtin_adapters()[adapter_id].export(entries)["text"].split("\n"):
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("- "):
            tags.append(section)
        else:
            assert line == ""
    assert tags == [f"{e.track}/{e.scope}" for e in _export_order(entries)]


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
def test_markdown_round_trip_of_markdown_looking_texts(adapter_id: str) -> None:
    texts = [
        "--",
        "- -",
        "* *",
        "-",
        "*",
        "# not a heading",
        "## user/workspace",
        '## memoryd: agent "x"',
        "```",
        "~~~ x",
        "---",
        "1. item",
        "**bold**",
        "a\n\nb",
        "a\r\n- b",
        "\t tab inside\tand after",
        "😀 日本語",
    ]
    entries = [
        Entry(
            id=str(i),
            track="user",
            scope="user-global",
            workspace_key="",
            agent_key="",
            text=text,
            source="s",
            tags=[],
            version=1,
            created_at=0,
            updated_at=0,
            last_recalled=None,
            recall_count=0,
            session_id=None,
        )
        for i, text in enumerate(texts)
    ]
    adapter = builtin_adapters()[adapter_id]
    back = adapter.adapt(adapter.export(entries))
    assert [e.text for e in back] == [
        "--", "- -", "* *", "-", "*", "# not a heading", "## user/workspace", '## memoryd: agent "x"', "```", "~~~ x", "---",
        "1. item", "**bold**", "a  b", "a - b", "tab inside\tand after", "😀 日本語",
    ]  # fmt: skip
    assert {(e.track, e.scope) for e in back} == {("user", "user-global")}


@settings(max_examples=150)
@given(entries=_entries())
def test_mem0_export_then_adapt_round_trips(entries: list[Entry]) -> None:
    adapter = builtin_adapters()["mem0"]
    document = json.loads(json.dumps(adapter.export(entries)))  # through real JSON
    back = adapter.adapt(document)
    assert [(e.track, e.scope, e.text, e.tags, e.workspace_key, e.agent_key) for e in back] == [
        (e.track, e.scope, e.text, e.tags, e.workspace_key or None, e.agent_key) for e in entries
    ]
    assert all(e.source == "mem0" for e in back)


def test_markdown_export_shape() -> None:
    entries = _export_entries()
    document = builtin_adapters()["hermes-memory-md"].export(entries)["text"]
    headings = [line for line in document.splitlines() if line.startswith("#")]
    assert headings == [
        '## memoryd: agent ""',
        "## agent/user-global",
        '## memoryd: workspace "/home/alice/repo", agent "coder"',
        "## agent/workspace",
        '## memoryd: agent ""',
        "## user/user-global",
        '## memoryd: workspace "/home/alice/repo", agent ""',
        "## user/workspace",
    ]
    assert builtin_adapters()["hermes-memory-md"].export([]) == {"plugin": "hermes-memory-md", "text": ""}


# --- registry (pure) ---------------------------------------------------------------------


def test_builtin_registry() -> None:
    registry = builtin_adapters()
    assert list(registry) == BUILTIN_IDS
    for adapter_id, adapter in registry.items():
        assert isinstance(adapter, Adapter)
        assert ADAPTER_ID_PATTERN.fullmatch(adapter_id)
        info = adapter.info()
        assert isinstance(info, AdapterInfo) and info.id == adapter_id
        assert info.import_formats and info.export_format
    wire = msgspec.to_builtins([adapter.info() for adapter in registry.values()])
    assert [row["id"] for row in wire] == BUILTIN_IDS
    assert set(wire[0]) == {"id", "name", "description", "version", "importFormats", "exportFormat"}
    assert builtin_adapters()["mem0"] is not registry["mem0"]  # fresh instances


@pytest.mark.parametrize("adapter_id", ["nope", "", "MEM0"])
def test_unknown_adapter_is_adapter_not_found(adapter_id: str) -> None:
    with pytest.raises(AdapterNotFound) as info:
        get_adapter(builtin_adapters(), adapter_id)
    assert info.value.code == "ADAPTER_NOT_FOUND"
    assert info.value.details == {"adapterId": adapter_id}
    assert info.value.to_wire()["code"] == -32018
    assert get_adapter(builtin_adapters(), "mem0").id == "mem0"


# --- third-party adapters: the contract wrappers -----------------------------------------


class _Custom(AdapterBase):
    def __init__(self, adapter_id: str = "custom", result: Any = None, exc: Exception | None = None) -> None:
        super().__init__(
            id=adapter_id,
            name="Custom",
            description="test adapter",
            version="0.0.1",
            import_formats=["text/plain"],
            export_format="text/plain",
        )
        self.result = result
        self.exc = exc

    def adapt(self, payload: Any) -> list[EntryInput]:
        if self.exc is not None:
            raise self.exc
        return self.result  # type: ignore[no-any-return]

    def export(self, entries: list[Entry]) -> Any:
        if self.exc is not None:
            raise self.exc
        return self.result


def test_adapt_payload_turns_unexpected_failures_into_adapter_payload() -> None:
    with pytest.raises(AdapterPayload) as info:
        adapt_payload(_Custom(exc=KeyError("secret memory text")), "x")
    assert info.value.details == {"adapterId": "custom"}
    assert "KeyError" in info.value.message and "secret" not in info.value.message
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize(
    "result",
    [
        "not a list",
        [{"track": "nope", "scope": "user-global", "text": "x"}],
        [{"track": "user", "scope": "user-global"}],
        [{"track": "user", "scope": "user-global", "text": "x", "tag": ["typo"]}],
        [EntryInput(track="user", scope="user-global", text="bad \ud800")],
        [42],
    ],
)
def test_adapt_payload_checks_the_result(result: Any) -> None:
    with pytest.raises(AdapterPayload) as info:
        adapt_payload(_Custom(result=result), "x")
    assert info.value.details["adapterId"] == "custom"


def test_adapt_payload_accepts_dicts_and_fills_the_source() -> None:
    entries = adapt_payload(
        _Custom(result=[{"track": "agent", "scope": "workspace", "text": "x", "agentKey": "a"}]),
        "x",
    )
    assert entries == [
        EntryInput(track="agent", scope="workspace", text="x", source="custom", agent_key="a"),
    ]


def test_adapt_payload_passes_protocol_errors_through() -> None:
    err = AdapterPayload("custom: line 3 is bad", {"adapterId": "custom", "line": 3})
    with pytest.raises(AdapterPayload) as info:
        adapt_payload(_Custom(exc=err), "x")
    assert info.value is err


def test_export_entries_refuses_non_json_documents() -> None:
    with pytest.raises(AdapterPayload):
        export_entries(_Custom(result={"when": object()}), [])
    with pytest.raises(AdapterPayload):
        export_entries(_Custom(exc=RuntimeError("boom")), [])
    assert export_entries(_Custom(result={"ok": [1, "two"]}), []) == {"ok": [1, "two"]}


# --- the daemon's registry: entry points -------------------------------------------------


class _EP:
    """A stand-in for importlib.metadata.EntryPoint."""

    def __init__(self, name: str, obj: Any = None, exc: Exception | None = None) -> None:
        self.name = name
        self.value = f"fake_module:{name}"
        self._obj = obj
        self._exc = exc

    def load(self) -> Any:
        if self._exc is not None:
            raise self._exc
        return self._obj


def test_load_adapters_without_third_parties_is_the_builtins() -> None:
    assert list(registry_mod.load_adapters([])) == BUILTIN_IDS


def test_load_adapters_accepts_instances_classes_and_factories() -> None:
    class Klass(_Custom):
        def __init__(self) -> None:
            super().__init__("from-class")

    registry = registry_mod.load_adapters(
        [
            _EP("b-instance", _Custom("from-instance")),
            _EP("a-class", Klass),
            _EP("c-factory", lambda: _Custom("from.factory_1")),
        ]
    )
    assert list(registry) == [*BUILTIN_IDS, "from-class", "from-instance", "from.factory_1"]
    assert [adapter.info().id for adapter in registry.values()] == list(registry)


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (_Custom("Bad-Id"), "does not match"),
        (_Custom("-leading-dash"), "does not match"),
        (_Custom("x" * 65), "does not match"),
        (_Custom("trailing-newline\n"), "does not match"),
        (object(), "attribute 'id' must be a string"),
        (42, "attribute 'id' must be a string"),
    ],
)
def test_load_adapters_refuses_malformed_adapters(obj: Any, reason: str) -> None:
    with pytest.raises(registry_mod.AdapterRegistryError, match=reason) as info:
        registry_mod.load_adapters([_EP("broken", obj)])
    assert "'broken'" in str(info.value) and "fake_module:broken" in str(info.value)
    assert isinstance(info.value, ValueError)


def _malformed(**overrides: Any) -> Any:
    adapter = _Custom("malformed")
    for attr, value in overrides.items():
        setattr(adapter, attr, value)
    return adapter


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (_malformed(name=None), "attribute 'name' must be a string"),
        (_malformed(version=1), "attribute 'version' must be a string"),
        (_malformed(import_formats="text/plain"), "'import_formats' must be a list of strings"),
        (_malformed(import_formats=[1]), "'import_formats' must be a list of strings"),
        (_malformed(adapt=None), r"method adapt\(\) is missing"),
        (_malformed(info=lambda: {"id": "malformed"}), "must return memoryd_protocol.types.AdapterInfo"),
        (
            _malformed(
                info=lambda: AdapterInfo(
                    id="other", name="", description="", version="", import_formats=[], export_format=""
                )
            ),
            "differs",
        ),
        (_malformed(info=lambda: 1 / 0), r"info\(\) failed: ZeroDivisionError"),
    ],
)
def test_load_adapters_refuses_wrong_members(obj: Any, reason: str) -> None:
    with pytest.raises(registry_mod.AdapterRegistryError, match=reason):
        registry_mod.load_adapters([_EP("broken", obj)])


def test_load_adapters_refuses_load_and_factory_failures() -> None:
    with pytest.raises(registry_mod.AdapterRegistryError, match="failed to load: ModuleNotFoundError"):
        registry_mod.load_adapters([_EP("gone", exc=ModuleNotFoundError("No module named 'fake_module'"))])

    def factory() -> Any:
        raise RuntimeError("no config")

    with pytest.raises(registry_mod.AdapterRegistryError, match=r"calling factory\(\) failed: RuntimeError"):
        registry_mod.load_adapters([_EP("boom", factory)])


def test_load_adapters_refuses_duplicate_ids() -> None:
    with pytest.raises(registry_mod.AdapterRegistryError, match="'mem0' is already registered by the built-in"):
        registry_mod.load_adapters([_EP("shadow", _Custom("mem0"))])
    with pytest.raises(registry_mod.AdapterRegistryError) as info:
        registry_mod.load_adapters([_EP("first", _Custom("same")), _EP("second", _Custom("same"))])
    message = str(info.value)
    assert "'second'" in message and "already registered by adapter entry point 'first'" in message


# --- the daemon's registry: a real installed distribution --------------------------------

_THIRD_PARTY_MODULE = """
from memoryd_protocol.adapters import AdapterBase
from memoryd_protocol.types import EntryInput


class NotesAdapter(AdapterBase):
    def __init__(self):
        super().__init__(id="{adapter_id}", name="Notes", description="one note per line",
                         version="0.1.0", import_formats=["text/plain"], export_format="text/plain")

    def adapt(self, payload):
        return [EntryInput(track="user", scope="user-global", text=line.strip(), source=self.id)
                for line in payload.splitlines() if line.strip()]

    def export(self, entries):
        return "\\n".join(e.text for e in entries)
"""


@pytest.fixture
def install_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Install a fake distribution (module + dist-info with entry points) on sys.path."""
    modules: list[str] = []

    def install(module: str, adapter_id: str, ep_name: str) -> None:
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / f"{module}.py").write_text(_THIRD_PARTY_MODULE.format(adapter_id=adapter_id))
        dist = site / f"{module}-0.1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1.0\n")
        (dist / "entry_points.txt").write_text(f"[memoryd.adapters]\n{ep_name} = {module}:NotesAdapter\n")
        modules.append(module)
        monkeypatch.syspath_prepend(str(site))  # also invalidates importlib's caches

    yield install
    for module in modules:
        sys.modules.pop(module, None)


def test_load_adapters_discovers_installed_entry_points(install_dist: Any) -> None:
    install_dist("memoryd_test_notes_adapter", "notes", "notes")
    assert [ep.name for ep in importlib.metadata.entry_points(group="memoryd.adapters")] == ["notes"]
    registry = registry_mod.load_adapters()
    assert list(registry) == [*BUILTIN_IDS, "notes"]
    notes = get_adapter(registry, "notes")
    assert adapt_payload(notes, "a\n\nb\n") == [
        EntryInput(track="user", scope="user-global", text="a", source="notes"),
        EntryInput(track="user", scope="user-global", text="b", source="notes"),
    ]


def test_installed_adapter_clashing_with_a_builtin_is_refused(install_dist: Any) -> None:
    install_dist("memoryd_test_clash_adapter", "hermes-memory-md", "my-hermes")
    with pytest.raises(registry_mod.AdapterRegistryError) as info:
        registry_mod.load_adapters()
    message = str(info.value)
    assert "'my-hermes'" in message and "memoryd_test_clash_adapter:NotesAdapter" in message
    assert "already registered by the built-in adapter" in message


# --- the plain look before importlib.metadata -------------------------------------------------


def dist_info(site: Path, name: str, entry_points: str | None) -> None:
    dist = site / name
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.partition('-')[0]}\nVersion: 0.1.0\n")
    if entry_points is not None:
        (dist / "entry_points.txt").write_text(entry_points)


def test_the_plain_look_finds_a_distribution_that_names_the_group(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist_info(site, "plain-1.0.dist-info", None)
    dist_info(site, "scripts-1.0.dist-info", "[console_scripts]\nx = plain:main\n")
    dist_info(site, "old-1.0.egg-info", "[pytest11]\nx = old\n")
    (site / "lonely-1.0.egg-info").write_text("Metadata-Version: 1.0\n")  # an egg-info that is a file
    missing = str(tmp_path / "missing")
    assert registry_mod.may_register([str(site), missing]) is False
    for name in ("notes-0.1.dist-info", "Notes-0.1.EGG-INFO"):
        other = tmp_path / name / "site"
        dist_info(other, name, "[memoryd.adapters]\nnotes = notes:NotesAdapter\n")
        assert registry_mod.may_register([str(site), str(other)]) is True


def test_the_plain_look_says_yes_to_what_it_cannot_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "site.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive
    egg = tmp_path / "thing-1.0-py3.11.egg"
    egg.mkdir()
    assert registry_mod.may_register([str(archive)]) is True
    assert registry_mod.may_register([str(egg)]) is True

    class Finder:
        def find_spec(self, *args: Any) -> None:
            return None

        def find_distributions(self, *args: Any) -> list[Any]:
            return []

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder()])
    assert registry_mod.may_register([]) is True


def test_a_start_without_third_party_adapters_does_not_import_importlib_metadata() -> None:
    code = ("import sys; from memoryd.adapter_registry import load_adapters; registry = load_adapters(); "
            "assert 'importlib.metadata' not in sys.modules, 'imported'; print(len(registry))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, str(len(BUILTIN_IDS)), "")
