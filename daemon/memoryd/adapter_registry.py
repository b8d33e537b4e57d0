"""The daemon's adapter registry: the built-ins plus third-party adapters from entry points.

A third-party package registers an adapter in the ``memoryd.adapters`` entry-point group::

    [project.entry-points."memoryd.adapters"]
    my-store = "my_package.memoryd_adapter:MyStoreAdapter"

It may load to an adapter instance, or a class or zero-argument factory that returns one
(``memoryd_protocol.adapters.Adapter``). Adapters are loaded once, at start-up, and a bad
one (a load failure, a wrong attribute, a bad or taken id, a disagreeing ``info()``) raises
:class:`AdapterRegistryError`: the daemon does not start with an adapter set it was not
asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from importlib.machinery import PathFinder
from typing import TYPE_CHECKING, Final, cast

from memoryd_protocol.adapters import ADAPTER_ID_PATTERN, Adapter, builtin_adapters
from memoryd_protocol.types import AdapterInfo

from .errors import DaemonError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

#: The entry-point group third-party adapters register in.
ENTRY_POINT_GROUP: Final = "memoryd.adapters"

_STRING_ATTRIBUTES: Final = ("id", "name", "description", "version", "export_format")
_METHODS: Final = ("adapt", "export", "info")


class AdapterRegistryError(DaemonError, ValueError):
    """A third-party adapter was refused at start-up."""


def discovered_entry_points() -> list[EntryPoint]:
    """The installed ``memoryd.adapters`` entry points. importlib.metadata, dear to import and
    to run, is asked only once ``may_register`` found somewhere one could be."""
    if not may_register():
        return []
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


_GROUP_HEADER: Final = f"[{ENTRY_POINT_GROUP}]".encode()


def may_register(path: Iterable[str] | None = None) -> bool:
    """Whether anything on ``path`` (``sys.path``) could hold a ``memoryd.adapters`` entry
    point, erring towards yes: a distribution whose ``entry_points.txt`` names the group, or
    anything this look cannot read as importlib.metadata would (a zip, an egg, another finder)."""
    if any(hasattr(f, "find_distributions") and f is not PathFinder for f in sys.meta_path):
        return True
    for entry in sys.path if path is None else path:
        root = entry or "."  # "" is the working directory, which importlib.metadata reads too
        if not os.path.isdir(root):
            if os.path.exists(root):
                return True  # a zip file (or anything else importlib.metadata may read)
            continue
        if root.lower().endswith(".egg"):
            return True
        try:
            children = os.listdir(root)
        except OSError:
            continue
        for child in children:
            if not child.lower().endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(root, child, "entry_points.txt"), "rb") as f:
                    if _GROUP_HEADER in f.read():
                        return True
            except OSError:
                continue  # none (or an egg-info that is a file): it registers nothing
    return False


def _describe(ep: EntryPoint) -> str:
    return f"adapter entry point {ep.name!r} ({ep.value})"


def _looks_like_adapter(obj: object) -> bool:
    return all(hasattr(obj, attr) for attr in (*_STRING_ATTRIBUTES, "import_formats", *_METHODS))


def _instantiate(ep: EntryPoint) -> object:
    where = _describe(ep)
    try:
        loaded = ep.load()
    except Exception as exc:
        raise AdapterRegistryError(f"{where} refused: it failed to load: {type(exc).__name__}: {exc}") from exc
    if isinstance(loaded, type) or (callable(loaded) and not _looks_like_adapter(loaded)):
        factory: Callable[[], object] = loaded
        try:
            return factory()
        except Exception as exc:
            raise AdapterRegistryError(
                f"{where} refused: calling {getattr(loaded, '__name__', 'it')}() failed: {type(exc).__name__}: {exc}"
            ) from exc
    return loaded


def check_adapter(obj: object, where: str) -> Adapter:
    """``obj`` as an :class:`Adapter`, or :class:`AdapterRegistryError` saying what is wrong."""

    def refuse(reason: str) -> AdapterRegistryError:
        return AdapterRegistryError(f"{where} refused: {reason}")

    for attr in _STRING_ATTRIBUTES:
        value = getattr(obj, attr, None)
        if not isinstance(value, str):
            raise refuse(f"attribute {attr!r} must be a string, got {type(value).__name__}")
    formats = getattr(obj, "import_formats", None)
    if not isinstance(formats, list) or not all(isinstance(f, str) for f in formats):
        raise refuse("attribute 'import_formats' must be a list of strings")
    for method in _METHODS:
        if not callable(getattr(obj, method, None)):
            raise refuse(f"method {method}() is missing")
    adapter = cast(Adapter, obj)  # every member was checked above
    adapter_id = adapter.id
    if not ADAPTER_ID_PATTERN.fullmatch(adapter_id):
        raise refuse(f"id {adapter_id!r} does not match ^[a-z0-9][a-z0-9._-]{{0,63}}$")
    try:
        info = adapter.info()
    except Exception as exc:
        raise refuse(f"info() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(info, AdapterInfo):
        raise refuse(f"info() must return memoryd_protocol.types.AdapterInfo, got {type(info).__name__}")
    if info.id != adapter_id:
        raise refuse(f"info().id {info.id!r} differs from the adapter's id {adapter_id!r}")
    return adapter


def load_adapters(sources: Iterable[EntryPoint] | None = None) -> dict[str, Adapter]:
    """The built-in adapters followed by the third-party ones, keyed by id. ``sources``
    defaults to the installed entry points; they are added in name order, so the
    ``adapters/list`` order does not depend on installation order."""
    registry = builtin_adapters()
    origin = {adapter_id: "the built-in adapter" for adapter_id in registry}
    eps = discovered_entry_points() if sources is None else list(sources)
    for ep in sorted(eps, key=lambda ep: (ep.name, ep.value)):
        where = _describe(ep)
        adapter = check_adapter(_instantiate(ep), where)
        if adapter.id in registry:
            raise AdapterRegistryError(
                f"{where} refused: adapter id {adapter.id!r} is already registered by {origin[adapter.id]}"
            )
        registry[adapter.id] = adapter
        origin[adapter.id] = where
    return registry
