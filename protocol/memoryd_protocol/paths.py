"""Default locations shared by the daemon and its clients (so ``memoryctl`` finds the
socket that ``memoryd serve`` opened without either importing the other)."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing itself costs an import; mypy still reads the block below
if TYPE_CHECKING:
    from pathlib import Path

# pathlib is imported where a Path is made, not here: memoryctl's read commands need only
# the socket's name (default_socket, pathlib_str), and pathlib (with urllib.parse, which it
# imports) was a tenth of their start-up.

APP = "memoryd"


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/memoryd``, else ``<tmp>/memoryd-<uid>``; created 0700 by the daemon."""
    from pathlib import Path

    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / APP
    import tempfile  # only needed without XDG_RUNTIME_DIR; keeps the daemon's start-up lean

    return Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}"


def private_socket_path() -> Path:
    """The per-user socket inside the 0700 runtime directory."""
    return runtime_dir() / "memoryd.sock"


def default_socket_path() -> Path:
    """``$MEMORYD_SOCKET`` when set, else the per-user socket."""
    from pathlib import Path

    env = os.environ.get("MEMORYD_SOCKET")
    return Path(env) if env else private_socket_path()


def _plain(path: str) -> bool:
    """Whether ``str(Path(path))`` is ``path`` itself (and ``expanduser`` leaves it be): an
    absolute path without empty or ``.`` components."""
    return path.startswith("/") and "//" not in path and "/./" not in path and not path.endswith(("/", "/."))


def pathlib_str(path: str) -> str:
    """``str(Path(path).expanduser())``, importing pathlib only when ``path`` is not plain."""
    if _plain(path):
        return path
    from pathlib import Path

    return str(Path(path).expanduser())


def absolute_str(path: str) -> str:
    """``str(Path(path).expanduser().absolute())``, importing pathlib only when ``path`` is
    not plain (the stdio relay's ``--socket`` and ``--db``)."""
    if _plain(path):
        return path
    from pathlib import Path

    return str(Path(path).expanduser().absolute())


def default_socket() -> str:
    """``str(default_socket_path())``, importing pathlib only when that path is not plain."""
    env = os.environ.get("MEMORYD_SOCKET")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    path = env if env else f"{xdg}/{APP}/memoryd.sock" if xdg else ""
    return path if _plain(path) else str(default_socket_path())


def _xdg_str(var: str, fallback: str) -> str | None:
    """The XDG base directory on Linux, as the XDG spec and platformdirs have it (``$VAR``
    when it is an absolute path, else ``~/<fallback>``), joined with ``memoryd``, or None
    elsewhere. Importing platformdirs costs the stdio relay and memoryctl a third of their
    start-up for what is, on Linux, one environment lookup; tests/test_paths.py keeps the
    two equal. A string as os.path.join makes it (not normalized as a Path is)."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    value = os.environ.get(var, "")
    return os.path.join(value if os.path.isabs(value) else os.path.expanduser(f"~/{fallback}"), APP)


def _xdg(var: str, fallback: str) -> Path | None:
    from pathlib import Path

    base = _xdg_str(var, fallback)
    return None if base is None else Path(base)


def default_config_str() -> str | None:
    """The default config file's name as a string (it names the file
    :func:`default_config_path` names, unnormalized), without pathlib; None off Linux."""
    base = _xdg_str("XDG_CONFIG_HOME", ".config")
    return None if base is None else os.path.join(base, "config.toml")


def default_db_path() -> Path:
    base = _xdg("XDG_DATA_HOME", ".local/share")
    if base is None:
        from pathlib import Path

        import platformdirs

        base = Path(platformdirs.user_data_dir(APP))
    return base / "memory.db"


def default_config_path() -> Path:
    base = _xdg("XDG_CONFIG_HOME", ".config")
    if base is None:
        from pathlib import Path

        import platformdirs

        base = Path(platformdirs.user_config_dir(APP))
    return base / "config.toml"


#: The daemon's log, next to its socket, when a starter (the relay, ``serve --detach``,
#: memoryctl's autostart) ran it detached.
LOG_NAME = "memoryd.log"


def log_path_for(socket_path: Path) -> Path:
    return socket_path.parent / LOG_NAME


def owner_record_path(db: Path) -> Path:
    """``<db>.memoryd-owner``: the pid and socket of the daemon that holds the store's lock
    (an exclusive flock on the db file), next to the store. It means something only while
    that flock is held."""
    return db.with_name(db.name + ".memoryd-owner")


__all__ = ["LOG_NAME", "absolute_str", "default_config_path", "default_config_str", "default_db_path", "default_socket", "default_socket_path",
           "log_path_for", "owner_record_path", "pathlib_str", "private_socket_path", "runtime_dir"]
