"""The adapters against the reference provider's own outputs (tests/fixtures/reference).

expected/ holds what dsh-memento 0.4.4's adapters give for every input there, produced by
running its code (generate.mjs); exports/ holds the documents its export commands print.
memoryd must give the same entries, except where the reference breaks the spec (see
docs/adapters.md, "Deviations"), and must export documents the reference reads back:
readback/ holds what the reference's own import stored from memoryd's exports
(memoryd-exports/) and from its own.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from memoryd_protocol.adapters import builtin_adapters, export_entries, fit_tag
from memoryd_protocol.errors import AdapterPayload
from memoryd_protocol.text import utf16_len
from memoryd_protocol.types import Entry, EntryInput

REF = Path(__file__).resolve().parent / "fixtures" / "reference"
MARKDOWN_IDS = ["hermes-memory-md", "claude-code-memory-md"]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PLACEMENT_LINE = re.compile(r'^## memoryd: (?:workspace|agent) ".*\n', re.M)


def _cases() -> list[Any]:
    out = []
    for path in sorted((REF / "expected").glob("*.json")):
        folder, name, adapter_id = path.stem.split("--")
        out.append(pytest.param(REF / folder / name, adapter_id, path, id=f"{folder}/{name}/{adapter_id}"))
    return out


def payload_of(path: Path, adapter_id: str) -> Any:
    """What memoryctl sends for the file: the raw text to a markdown adapter (whose import
    format is text), the parsed JSON to mem0."""
    raw = path.read_bytes().decode("utf-8")
    return json.loads(raw) if adapter_id == "mem0" else raw


def _spec_tag(tag: str) -> str:
    """A section name as memoryd tags it: unchanged unless the reference's tag breaks the
    spec (longer than 32 units, control characters), which memoryd cuts to fit instead."""
    if utf16_len(tag) > 32 or _CONTROL.search(tag):
        fitted = fit_tag(tag)
        assert fitted is not None
        return fitted
    return tag


def _facts(payload: Any) -> list[Any]:
    if isinstance(payload, dict):
        return list(payload.get("facts") or payload.get("results") or [])
    return list(payload)


def expected_rows(reference: list[dict[str, Any]], adapter_id: str, payload: Any) -> list[tuple[Any, ...]]:
    """The reference's entries with the documented deviations applied: tags fit the spec,
    and mem0 metadata.track/scope/workspace_key/agent_key (what the mem0 export writes) are
    kept, where the reference drops them."""
    rows = []
    facts = _facts(payload) if adapter_id == "mem0" else []
    for n, e in enumerate(reference):
        track, scope, wk, ak = e["track"], e["scope"], None, None
        if facts:
            meta = facts[n].get("metadata") or {}
            track, scope = meta.get("track", track), meta.get("scope", scope)
            wk, ak = meta.get("workspace_key") or None, meta.get("agent_key")
        rows.append((track, scope, e["text"], e["source"], [_spec_tag(t) for t in e.get("tags", [])], wk, ak))
    return rows


def rows(entries: list[EntryInput]) -> list[tuple[Any, ...]]:
    return [(e.track, e.scope, e.text, e.source, e.tags, e.workspace_key, e.agent_key) for e in entries]


@pytest.mark.parametrize(("path", "adapter_id", "expected_path"), _cases())
def test_adapters_give_the_references_entries(path: Path, adapter_id: str, expected_path: Path) -> None:
    reference = json.loads(expected_path.read_text(encoding="utf-8"))
    adapter = builtin_adapters()[adapter_id]
    payload = payload_of(path, adapter_id)
    if adapter_id == "mem0" and isinstance(payload, dict) and "results" in payload:
        # Deviation: mem0's own {results} shape, which the reference refuses, reads as its array.
        assert "error" in reference
        reference = json.loads((REF / "expected" / f"{path.parent.name}--{path.stem.removesuffix('-add')}"
                                f"-facts.json--mem0.json").read_text(encoding="utf-8"))
        payload = payload["results"]
    if "error" in reference:
        with pytest.raises(AdapterPayload) as info:
            adapter.adapt(payload)
        line = re.search(r"line (\d+)", reference["error"]["message"])
        if line:  # the same line is named
            assert info.value.details["line"] == int(line.group(1))
        return
    assert rows(adapter.adapt(payload)) == expected_rows(reference["entries"], adapter_id, payload)


def test_a_saved_markdown_export_is_read_as_the_reference_reads_it() -> None:
    """A ``{plugin, text}`` document (what ``/memory export --adapter`` prints) given to a
    markdown adapter as a file's raw text: its ``text`` is the markdown, never the JSON."""
    for adapter_id in MARKDOWN_IDS:
        raw = (REF / "exports" / f"{adapter_id}.json").read_text(encoding="utf-8")
        entries = builtin_adapters()[adapter_id].adapt(raw)
        assert [e.text for e in entries] == ["Uses pnpm, never npm", "Line one line two",
                                             "Run make check before pushing", "Prefers tea",
                                             "Wants short answers in this repo"]
        assert not any("plugin" in e.text for e in entries)


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
@pytest.mark.parametrize(("doc", "says"), [
    ("exports/envelope.json", "is a memory-export-v1 envelope: import it without an adapter"),
    ("exports/mem0.json", "is a mem0 document: import it with the mem0 adapter"),
    ("real/mem0-node-quickstart-facts.json", "is a mem0 document: import it with the mem0 adapter"),
    ("inputs/hermes-number.json", "is number JSON without a 'text' field"),
])
def test_a_json_document_without_markdown_is_refused_clearly(adapter_id: str, doc: str, says: str) -> None:
    raw = (REF / doc).read_text(encoding="utf-8")
    with pytest.raises(AdapterPayload) as info:
        builtin_adapters()[adapter_id].adapt(raw)
    assert says in info.value.message


def _reference_entries(prefix: str = "") -> list[Entry]:
    envelope = json.loads((REF / "exports" / f"{prefix}envelope.json").read_text(encoding="utf-8"))
    return [msgspec.convert({**e, "sessionId": None}, Entry) for e in envelope["entries"]]


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
def test_markdown_export_is_the_references_document(adapter_id: str) -> None:
    """Same entries, same document: ``{plugin, text}``, sections in the reference's order,
    bullets in creation order, no final newline. memoryd's placement lines (which the
    reference reads as empty sections) are the only addition."""
    ours = export_entries(builtin_adapters()[adapter_id], _reference_entries("simple-"))
    theirs = json.loads((REF / "exports" / f"simple-{adapter_id}.json").read_text(encoding="utf-8"))
    assert set(ours) == {"plugin", "text"} and ours["plugin"] == theirs["plugin"] == adapter_id
    assert _PLACEMENT_LINE.sub("", ours["text"]) == theirs["text"]
    assert ours["text"] != theirs["text"]  # the placement lines are there


def _readbacks() -> list[Any]:
    return [pytest.param(path, id=path.stem) for path in sorted((REF / "readback").glob("*.json"))]


@pytest.mark.parametrize("path", _readbacks())
def test_each_reading_by_the_reference_is_of_the_document_as_it_is(path: Path) -> None:
    """readback/ is generate.mjs's record of the reference reading a document: the document
    has not changed since (else: run generate.mjs with ``readback``)."""
    folder, name, _ = path.stem.split("--")
    read = json.loads(path.read_text(encoding="utf-8"))["read"]
    assert read == hashlib.sha256((REF / folder / name).read_bytes()).hexdigest(), (
        f"{folder}/{name} changed since the reference read it: node generate.mjs CHECKOUT readback")


#: the session generate.mjs imports from: dsh-memento gives every entry without a workspaceKey
#: (every user-global one) this cwd, and every entry without an agentKey this (no) preset
READER_CWD = "/home/u/elsewhere"


def _memoryd_store() -> list[dict[str, Any]]:
    """The entries of the store memoryd exported (tests/test_e2e_reference_readback.py)."""
    return list(json.loads((REF / "memoryd-exports" / "envelope.json").read_text(encoding="utf-8"))["entries"])


def _stored(e: dict[str, Any]) -> tuple[Any, ...]:
    return (e["track"], e["scope"], e["workspaceKey"], e["agentKey"], e["text"], e["source"], e["tags"])


def _read_back(folder: str, name: str, how: str) -> list[tuple[Any, ...]]:
    reading = json.loads((REF / "readback" / f"{folder}--{name}.json--{how}.json").read_text(encoding="utf-8"))
    assert "error" not in reading, reading
    return sorted(_stored(e) for e in reading["entries"])


def test_the_reference_imports_memoryds_envelope_whole() -> None:
    """Every entry, in its layer: the reference keeps track, scope, text, source and the keys
    (its envelope import drops tags, and stamps its own cwd where the key is '')."""
    store = _memoryd_store()
    assert sorted(_stored({**e, "tags": [], "workspaceKey": e["workspaceKey"] or READER_CWD}) for e in store) == \
        _read_back("memoryd-exports", "envelope", "envelope")


def test_the_reference_imports_memoryds_mem0_export_as_its_own() -> None:
    store = _memoryd_store()
    assert sorted(("user", "user-global", READER_CWD, "", e["text"], "mem0", e["tags"]) for e in store) == \
        _read_back("memoryd-exports", "mem0", "mem0") == _read_back("exports", "mem0", "mem0")


@pytest.mark.parametrize("reader", MARKDOWN_IDS)
@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
def test_the_reference_imports_memoryds_markdown_export_as_its_own(adapter_id: str, reader: str) -> None:
    """Each entry a bullet under its track/scope, as the reference's own export of the same
    store reads: memoryd's placement lines are headings with no bullet under them."""
    store = _memoryd_store()
    want = sorted(("user", "user-global", READER_CWD, "", e["text"].replace("\n", " "), reader,
                   [f"{e['track']}/{e['scope']}"]) for e in store)
    assert want == _read_back("memoryd-exports", adapter_id, reader) == _read_back("exports", adapter_id, reader)


@pytest.mark.parametrize("prefix", ["", "simple-"])
def test_mem0_export_is_the_references_document(prefix: str) -> None:
    ours = export_entries(builtin_adapters()["mem0"], _reference_entries(prefix))
    theirs = json.loads((REF / "exports" / f"{prefix}mem0.json").read_text(encoding="utf-8"))
    assert ours == theirs  # created_at/updated_at are epoch milliseconds, as the reference writes


@pytest.mark.parametrize("adapter_id", MARKDOWN_IDS)
def test_memoryd_markdown_export_round_trips_in_place(adapter_id: str) -> None:
    """memoryd's own export names every section's layer, so reading it back restores each
    entry's track, scope, workspace and agent (the shared layer included)."""
    adapter = builtin_adapters()[adapter_id]
    entries = _reference_entries()
    back = adapter.adapt(export_entries(adapter, entries))
    want = sorted((e.track, e.scope, e.text.replace("\n", " "), e.workspace_key if e.scope == "workspace" else "",
                   e.agent_key) for e in entries)
    assert sorted((e.track, e.scope, e.text, e.workspace_key or "", e.agent_key) for e in back) == want


def test_deviations_where_the_reference_breaks_the_spec() -> None:
    """A section name over 32 units or with a control character is cut to a valid tag (the
    reference's import refuses the whole file); a lone surrogate is refused naming its line."""
    adapter = builtin_adapters()["claude-code-memory-md"]
    long = "A section name that runs well past thirty-two units"
    (entry,) = adapter.adapt(f"## {long}\n- kept whole\n")
    assert (entry.track, entry.scope, entry.text, entry.tags) == ("user", "user-global", "kept whole",
                                                                  [fit_tag(long)])
    (entry,) = adapter.adapt("## Tab\there\n- x\n")
    assert entry.tags == ["Tab here"]
    with pytest.raises(AdapterPayload) as info:
        adapter.adapt("## S\n- fine\n- bad \ud800\n")
    assert info.value.details["line"] == 3
