"""Pure logic: UTF-16 counting, ASCII-only folding, tags, keys, payload text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memoryd_protocol import payloads
from memoryd_protocol.errors import AmbiguousMatch, BudgetExceeded, EntryNotFound, InvalidInput
from memoryd_protocol.text import (
    ascii_fold,
    cut_units,
    has_lone_surrogate,
    normalize_agent_key,
    normalize_tags,
    normalize_workspace_key,
    utf16_len,
)
from memoryd_protocol.validation import check_budget, check_text, resolve_one

text_st = st.text(alphabet=st.characters(blacklist_categories=("Cs",)))


@given(text_st)
def test_utf16_len_matches_javascript_length(s: str) -> None:
    assert utf16_len(s) == len(s.encode("utf-16-le")) // 2


def test_utf16_examples() -> None:
    assert utf16_len("abc") == 3
    assert utf16_len("中文") == 2
    assert utf16_len("😀") == 2
    assert utf16_len("a😀中") == 4


@given(text_st)
def test_ascii_fold_changes_only_ascii_capitals(s: str) -> None:
    folded = ascii_fold(s)
    assert len(folded) == len(s)
    for a, b in zip(s, folded, strict=True):
        assert b == (a.lower() if "A" <= a <= "Z" else a)


def test_ascii_fold_leaves_non_ascii_alone() -> None:
    assert ascii_fold("ÉCOLE Straße İ") == "École straße İ"
    # str.lower() would turn İ into two code points; the protocol must not.
    assert len(ascii_fold("İ")) == 1


@given(text_st, st.integers(min_value=1, max_value=50))
def test_cut_units_bounds(s: str, limit: int) -> None:
    cut = cut_units(s, limit)
    if utf16_len(s) <= limit:
        assert cut == s
    else:
        assert cut.endswith("…")
        assert utf16_len(cut[:-1]) <= limit
        assert s.startswith(cut[:-1])


def test_cut_units_never_splits_a_pair() -> None:
    assert cut_units("a😀b", 2) == "a…"


@given(st.lists(st.text(alphabet="abc XYZ", min_size=1, max_size=8).filter(lambda t: t.strip()), max_size=10))
def test_normalize_tags_idempotent_and_unique(tags: list[str]) -> None:
    once = normalize_tags(tags)
    assert normalize_tags(once) == once
    assert len(set(once)) == len(once)
    assert all(t == t.strip() for t in once)


@pytest.mark.parametrize(
    "tags",
    [["x"] * 1 + [f"t{i}" for i in range(16)], ["a" * 33], ["ok", "bad\x07"], ["  "], ["\ud800"]],
)
def test_normalize_tags_refuses(tags: list[str]) -> None:
    with pytest.raises(InvalidInput):
        normalize_tags(tags)


def test_tag_limit_counts_utf16_units() -> None:
    assert normalize_tags(["😀" * 16]) == ["😀" * 16]
    with pytest.raises(InvalidInput):
        normalize_tags(["😀" * 16 + "a"])


def test_keys() -> None:
    assert normalize_workspace_key("/home/u/proj/", {}) == "/home/u/proj"
    assert normalize_workspace_key("/home/u/./proj/../proj", {}) == "/home/u/proj"
    assert normalize_workspace_key("C:\\Users\\Me\\Proj", {}) == "c:/users/me/proj"
    assert normalize_workspace_key(None, {}) == ""
    with pytest.raises(InvalidInput):
        normalize_workspace_key("relative/path", {})
    assert normalize_agent_key(" Coder ") == "coder"


def test_text_checks() -> None:
    assert check_text("  hi  ") == "hi"
    with pytest.raises(InvalidInput):
        check_text("   ")
    assert has_lone_surrogate("a\udc00")
    with pytest.raises(InvalidInput):
        check_text("a\ud800")


def test_resolve_one() -> None:
    rows = [("1", "Prefers TABS"), ("2", "uses vim"), ("3", "École")]
    assert resolve_one(rows, "user", "user-global", "tabs") == "1"
    with pytest.raises(EntryNotFound):
        resolve_one(rows, "user", "user-global", "école")  # É is not folded
    with pytest.raises(AmbiguousMatch) as exc:
        resolve_one(rows, "user", "user-global", "s")
    assert exc.value.details["candidates"] == 2
    assert len(exc.value.details["sample"]) == 2


def test_budget_check() -> None:
    check_budget("user", "user-global", 90, 100, 10)
    check_budget("user", "user-global", 150, 100, -5)  # shrinking always allowed
    check_budget("user", "user-global", 150, 100, 0)  # a write that does not grow usage passes
    with pytest.raises(BudgetExceeded) as exc:
        check_budget("user", "user-global", 90, 100, 11)
    # needed is the total the layer would need (used + this write), as the reference computes it
    assert exc.value.details == {"track": "user", "scope": "user-global", "used": 90, "limit": 100, "needed": 101}
    assert exc.value.message == (
        "memory budget exceeded: user/user-global has 90/100 characters used, this write would bring it to "
        "101/100 (11 more); make room with memoryctl consolidate or memoryctl remove, or raise the budget: "
        "user_global = N under [budgets.user] in memoryd's config.toml, then restart memoryd"
    )
    with pytest.raises(BudgetExceeded) as exc:
        check_budget("agent", "workspace", 150, 100, 1)  # a lowered limit left the layer over budget
    assert exc.value.details == {"track": "agent", "scope": "workspace", "used": 150, "limit": 100, "needed": 151}


def test_payload_texts() -> None:
    assert payloads.replace_text("old", "new") == "from:\nold\n\nto:\nnew"
    long = "x" * 400
    text = payloads.consolidate_text([("a", "alpha"), ("b", long)], "merged")
    assert text == f"remove: a\nalpha\nremove: b\n{'x' * 300}…\nnew text: merged"
    assert payloads.seed_text([("user", "workspace", "t1"), ("agent", "user-global", "t2")]) == (
        "user/workspace: t1\nagent/user-global: t2"
    )
    assert payloads.reason("replace", "user", "user-global", "dsh-memento", "T") == (
        "[dsh-memento] replace user/user-global [source:dsh-memento]\nT"
    )
    assert payloads.reason("seed", "batch", "batch", "s", "T", 3) == "[dsh-memento] seed (3 entries) batch/batch [source:s]\nT"
    assert payloads.normalize_outcome("allowed-always") == "rejected"
    assert payloads.outcome_label("allowed-once", "ask") == "allowed-once (via approval, writePolicy ask)"


def test_trim_is_javascripts() -> None:
    from memoryd_protocol.text import js_trim

    assert js_trim("\ufeff\u3000 hi \u2028\n") == "hi"
    assert js_trim("\x1chi\x1f") == "\x1chi\x1f"  # str.strip() would remove these; JS trim() keeps them
    assert check_text("\xa0note\xa0") == "note"
