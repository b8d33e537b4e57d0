"""dsh-memory-protocol v1 as memoryd speaks it: wire types, errors, validation. Pure: no I/O.

The package itself holds the version and the protocol's name; each submodule (``errors``,
``types``, ``methods``, ``ledger``, ...) is imported by name."""

from __future__ import annotations

from . import constants
from ._version import __version__
from .constants import PROTOCOL, STORE_SCHEMA_VERSION

#: The distribution this package ships in. ``__version__`` is its version: pyproject.toml
#: holds the one literal, and hatchling's version build hook writes it into ``_version.py``
#: at install.
DISTRIBUTION = "dsh-memoryd"

__all__ = ["DISTRIBUTION", "PROTOCOL", "STORE_SCHEMA_VERSION", "__version__", "constants"]
