"""The blocking client is derived from the async one: every public coroutine of Client has
its one-line blocking counterpart on SyncClient, wrapping that very coroutine, and no more."""

from __future__ import annotations

import inspect

from memoryd_client import Client, SyncClient
from memoryd_client.sync import _Blocking

# Coroutines of Client that SyncClient serves otherwise: close() ends the connection and the
# portal's event loop together.
SERVED_OTHERWISE = {"aclose": "close"}


def coroutines(cls: type) -> dict[str, object]:
    return {
        name: getattr(cls, name)
        for name in dir(cls)
        if not name.startswith("_") and inspect.iscoroutinefunction(getattr(cls, name))
    }


def blocking(cls: type) -> dict[str, _Blocking[..., object]]:
    found = {name: inspect.getattr_static(cls, name) for name in dir(cls)}
    return {name: attr for name, attr in found.items() if isinstance(attr, _Blocking)}


def test_every_coroutine_of_the_async_client_is_on_the_sync_client() -> None:
    missing = sorted(
        name for name in coroutines(Client)
        if name not in SERVED_OTHERWISE and not isinstance(inspect.getattr_static(SyncClient, name, None), _Blocking)
    )
    assert missing == [], f"add `name = _Blocking(Client.name)` to SyncClient for: {missing}"
    for name, other in SERVED_OTHERWISE.items():
        assert callable(getattr(SyncClient, other)), f"SyncClient lacks {other}, which serves {name}"


def test_each_blocking_method_wraps_the_coroutine_of_its_name_and_no_other() -> None:
    async_methods = coroutines(Client)
    for name, attr in blocking(SyncClient).items():
        assert name in async_methods and name not in SERVED_OTHERWISE, f"SyncClient.{name} has no coroutine on Client"
        assert attr.method is async_methods[name], f"SyncClient.{name} wraps {attr.method.__qualname__}"


def test_blocking_methods_show_the_async_signature_and_docstring() -> None:
    c = object.__new__(SyncClient)  # no connection: only the attributes are read
    for name, attr in blocking(SyncClient).items():
        method = getattr(c, name)
        params = list(inspect.signature(attr.method).parameters.values())[1:]
        assert list(inspect.signature(method).parameters.values()) == params, name
        assert method.__name__ == name and method.__doc__ == attr.method.__doc__, name
