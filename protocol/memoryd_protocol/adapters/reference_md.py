"""Markdown as the reference provider (dsh-memento) reads it, and JSON documents met on
the way.

A markdown file that carries none of memoryd's placement headings is read exactly as
dsh-memento 0.4's ``hermes-memory-md`` and ``claude-code-memory-md`` adapters read it, so
the same file gives the same memory in either provider:

* lines are split at ``\\n`` or ``\\r\\n``; a blank line (only whitespace) ends a paragraph;
* only a line starting ``## `` is a heading: its trimmed rest names the section, which
  becomes the tag of the entries under it (a ``#`` or ``###`` line is text);
* a line starting ``- `` or ``* `` (in the first column) is a bullet: one entry, trimmed;
  an empty one is skipped;
* any other line: ``hermes-memory-md`` refuses it naming its line; ``claude-code-memory-md``
  adds it, trimmed, to the paragraph, whose lines are joined by one space;
* every entry lands in ``user/user-global`` with the adapter id as its source.

Where that breaks the protocol's spec, memoryd deviates (docs/adapters.md lists each): a
section name longer than 32 UTF-16 units or holding a control character becomes a tag cut
to fit (the reference's import refuses the whole file), a line with a lone surrogate is
refused naming it, and a leading byte-order mark is not text.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from ..constants import EXPORT_PLUGIN, EXPORT_SCHEMA, MAX_TAG_UNITS
from ..text import has_lone_surrogate, js_trim, utf16_len
from ..types import EntryInput
from .base import AdapterBase, fit_tag, json_type

_LINE: Final = re.compile(r"\r?\n")
# The characters a tag may not hold (as normalize_tags refuses them).
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def spec_tag(section: str) -> str | None:
    """The tag a section name gives: the name itself, unless it breaks the tag rules."""
    if not section:
        return None
    if utf16_len(section) > MAX_TAG_UNITS or _CONTROL.search(section):
        return fit_tag(section)
    return section


def read_like_reference(adapter: AdapterBase, text: str, *, prose: bool) -> list[EntryInput]:
    entries: list[EntryInput] = []
    section = ""
    paragraph: list[str] = []

    def push(body: str) -> None:
        tag = spec_tag(section)
        entries.append(EntryInput(track="user", scope="user-global", text=body, tags=[tag] if tag else [],
                                  source=adapter.id))

    def flush() -> None:
        body = js_trim(" ".join(paragraph))
        paragraph.clear()
        if body:
            push(body)

    for number, line in enumerate(_LINE.split(text), start=1):
        if has_lone_surrogate(line):
            raise adapter.error(f"line {number} contains a lone UTF-16 surrogate", line=number)
        if not js_trim(line):
            flush()
        elif line.startswith("## "):
            flush()
            section = js_trim(line[3:])
        elif line.startswith(("- ", "* ")):
            flush()
            body = js_trim(line[2:])
            if body:
                push(body)
        elif prose:
            paragraph.append(js_trim(line))
        else:
            raise adapter.error(f"line {number} is neither a '## ' heading nor a '- '/'* ' bullet; this format "
                                "takes bullet lists only (claude-code-memory-md also takes prose)", line=number)
    flush()
    return entries


def markdown_of(adapter: AdapterBase, payload: Any) -> str:
    """The markdown in a payload: a string, or ``{text}`` such as a saved ``{plugin, text}``
    export. A string that is a JSON document is decoded first, so a saved export is read for
    its text and never stored as a memory."""
    if isinstance(payload, str):
        try:  # as the reference's import reads a file: JSON when it parses
            decoded = msgspec.json.decode(payload)
        except (msgspec.DecodeError, UnicodeEncodeError):
            return payload.removeprefix("\ufeff")
        if isinstance(decoded, str):
            return decoded
        payload = decoded
    if isinstance(payload, dict) and isinstance(payload.get("text"), str):
        text: str = payload["text"]
        return text.removeprefix("\ufeff")
    raise adapter.error(_not_markdown(payload))


def _not_markdown(payload: Any) -> str:
    if isinstance(payload, dict):
        if "text" in payload:
            return f"payload's 'text' must be a string (the markdown), got {json_type(payload['text'])}"
        if payload.get("plugin") == EXPORT_PLUGIN or payload.get("schema") == EXPORT_SCHEMA:
            return ("payload is a memory-export-v1 envelope: import it without an adapter "
                    "(memoryctl import FILE)")
        if payload.get("plugin") == "mem0" or isinstance(payload.get("facts"), list) \
                or isinstance(payload.get("results"), list):
            return "payload is a mem0 document: import it with the mem0 adapter (memoryctl import --adapter mem0 FILE)"
    if isinstance(payload, list) and payload and all(isinstance(f, dict) and "memory" in f for f in payload):
        return "payload is a mem0 document: import it with the mem0 adapter (memoryctl import --adapter mem0 FILE)"
    return (f"payload is {json_type(payload)} JSON without a 'text' field: give the markdown text, or a "
            "{plugin, text} document such as this adapter's export")


__all__ = ["markdown_of", "read_like_reference", "spec_tag"]
