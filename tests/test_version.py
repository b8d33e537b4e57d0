"""One version: pyproject.toml's, as the installed metadata has it, is what every package
says (hatchling's version build hook writes it into memoryd_protocol/_version.py)."""

from __future__ import annotations

import importlib.metadata

import memoryd
import memoryd_client
import memoryd_protocol


def test_every_package_says_the_installed_version() -> None:
    installed = importlib.metadata.version(memoryd_protocol.DISTRIBUTION)
    assert memoryd_protocol.__version__ == memoryd.__version__ == memoryd_client.__version__ == installed
