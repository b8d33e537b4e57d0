"""The effective write policy (Config.policy_for): a layer's policy, only ever tightened by
the sources a write touches."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from memoryd.config import Config, apply

POLICIES = ["auto", "ask", "off"]  # loosest first
LAYER = ("user", "user-global")
OTHER_LAYER = ("agent", "workspace")


def config(write_policy: str | None = None, overrides: dict[str, str] | None = None) -> Config:
    """A config as the TOML file would give it: ``write_policy`` and ``[write_policies]``."""
    raw: dict[str, Any] = {}
    if write_policy is not None:
        raw["write_policy"] = write_policy
    if overrides:
        raw["write_policies"] = overrides
    cfg = Config()
    apply(cfg, raw)
    return cfg


def strictest(*policies: str) -> str:
    return POLICIES[max(POLICIES.index(p) for p in policies)]


def test_default_is_ask_without_any_override() -> None:
    assert config().policy_for([LAYER], ["dsh-memento"]) == "ask"


@pytest.mark.parametrize("default", POLICIES)
def test_default_applies_without_overrides(default: str) -> None:
    assert config(default).policy_for([LAYER], ["dsh-memento", "claude"]) == default


@pytest.mark.parametrize(("default", "layer"), list(itertools.product(POLICIES, POLICIES)))
def test_layer_override_replaces_the_default_both_ways(default: str, layer: str) -> None:
    cfg = config(default, {"user/user-global": layer})
    assert cfg.policy_for([LAYER], ["dsh-memento"]) == layer
    assert cfg.policy_for([OTHER_LAYER], ["dsh-memento"]) == default


def test_a_layer_override_loosens_a_default_ask() -> None:
    assert config("ask", {"agent/workspace": "auto"}).policy_for([OTHER_LAYER], ["dsh-memento"]) == "auto"


def test_a_source_label_never_loosens_a_closed_layer() -> None:
    cfg = config("ask", {"user/user-global": "off", "source:ci-bot": "auto"})
    assert cfg.policy_for([LAYER], ["ci-bot"]) == "off"


def test_a_source_label_never_loosens_the_default() -> None:
    assert config("ask", {"source:ci-bot": "auto"}).policy_for([LAYER], ["ci-bot"]) == "ask"


def test_a_removed_entrys_source_tightens_an_auto_default() -> None:
    cfg = config("auto", {"source:claude": "ask"})
    assert cfg.policy_for([LAYER], ["dsh-memento", "claude"]) == "ask"
    assert cfg.policy_for([LAYER], ["dsh-memento"]) == "auto"


def test_the_strictest_of_several_sources_wins_in_any_order() -> None:
    cfg = config("auto", {"source:a": "ask", "source:b": "off", "source:c": "auto"})
    for order in itertools.permutations(["a", "b", "c"]):
        assert cfg.policy_for([LAYER], order) == "off"
    assert cfg.policy_for([LAYER], ["c", "a", "c"]) == "ask"


def test_a_batch_takes_the_strictest_of_its_layers() -> None:
    cfg = config("ask", {"agent/workspace": "auto", "user/user-global": "off"})
    assert cfg.policy_for([OTHER_LAYER], ["s"]) == "auto"
    assert cfg.policy_for([OTHER_LAYER, OTHER_LAYER], ["s"]) == "auto"
    assert cfg.policy_for([OTHER_LAYER, ("agent", "user-global")], ["s"]) == "ask"
    assert cfg.policy_for([OTHER_LAYER, LAYER], ["s"]) == "off"


def test_a_write_without_a_layer_is_a_bug() -> None:
    with pytest.raises(ValueError, match="at least one layer"):
        config("auto").policy_for([], ["s"])


# Every combination of default, layer override (or none) and up to two sources, each with
# an override (or none): the result is the layer's policy tightened by every source, and
# never looser than the layer's.
_NONE = None
_COMBOS = list(itertools.product(POLICIES, [_NONE, *POLICIES], [_NONE, *POLICIES], [_NONE, *POLICIES]))


@pytest.mark.parametrize(("default", "layer", "first", "second"), _COMBOS)
def test_every_combination(default: str, layer: str | None, first: str | None, second: str | None) -> None:
    overrides = {k: v for k, v in (("user/user-global", layer), ("source:one", first), ("source:two", second))
                 if v is not None}
    cfg = config(default, overrides)
    base = layer if layer is not None else default
    for sources, tightening in ((["one"], [first]), (["two"], [second]), (["one", "two"], [first, second]),
                                (["two", "one", "unlisted"], [second, first]), ([], [])):
        got = cfg.policy_for([LAYER], sources)
        assert got == strictest(base, *(p for p in tightening if p is not None)), (sources, got)
        assert POLICIES.index(got) >= POLICIES.index(base)
