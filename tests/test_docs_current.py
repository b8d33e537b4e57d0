"""The README keeps up with the code: every config key in the Configuration table, every
``memoryd`` command in its synopsis, and the relay's owner-record rule where the relay is
described (the rule itself: tests/test_mcp_process.py)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from memoryd import cli, config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def test_every_config_key_is_in_the_configuration_table() -> None:
    section = _section(README, "## Configuration")
    documented = {name for row in re.findall(r"^\| ([^|]+) \|", section, re.M) for name in re.findall(r"`([a-z_]+)`", row)}
    keys = {*config._INTS, *config._SECONDS, *config._CHOICES, "db_path", "socket_path", "write_policy"}
    assert sorted(keys - documented) == []
    cfg = config.Config()
    assert f"| `mcp_approvals` | `\"{cfg.mcp_approvals}\"` |" in section  # the default as the code has it


def test_the_synopsis_names_every_memoryd_command() -> None:
    section = _section(README, "## Configuration")
    synopsis = section[section.index("```\n") + 4:section.index("\n```", section.index("```\n") + 4)]
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    shown = re.findall(r"^memoryd ([a-z-]+)", synopsis, re.M)
    assert [c for c in shown if not c.startswith("-")] == list(sub.choices)
    for name, command in sub.choices.items():  # and each of its options
        line = synopsis[synopsis.index(f"memoryd {name}"):].split("\nmemoryd ")[0]
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    assert option in line, (name, option)


def _paragraph(text: str, start: str) -> str:
    at = text.index(start)
    return " ".join(text[at:text.find("\n- ", at + 1)].split())


def test_the_relay_is_described_following_the_owner_record() -> None:
    readme = _paragraph(README, "- On the default socket the relay")
    clients = _paragraph((ROOT / "docs" / "clients.md").read_text(), "- The stdio relay:")
    assert "follows the store's owner record" in readme and "`<db>.memoryd-owner`" in readme
    assert "rather than start a second one" in readme
    assert "follows the store's owner record" in clients and "`<db>.memoryd-owner`" in clients
    assert "instead of starting a second daemon" in clients
