"""The socket's directory is private, or memoryd does not use it (as ssh-agent and tmux).

Whoever controls the directory that holds the socket can replace the socket with one of
their own, and read what clients send, or answer as the daemon; they can also plant a
symlink where the start lock or the log is created. So the daemon, ``serve --detach`` and
the stdio relay use a socket directory only when it is a real directory (not a symlink),
owned by the effective uid, with no group or other permission bits. A directory created
by someone else beforehand, ``<tmp>/memoryd-<uid>`` in a shared ``/tmp`` for example, is
refused with one line, never repaired: a chmod would leave its owner in control.

Stdlib only: the relay checks before it connects, on every harness spawn.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import DaemonError


class UnsafeDir(DaemonError):
    """The socket directory is not private to this uid; the message is one line."""


def check_private_dir(path: str | Path, *, missing_ok: bool = False) -> None:
    """Raise :class:`UnsafeDir` unless ``path`` is a directory owned by our effective uid
    with mode 0700 (no group or other bits). A missing directory passes with
    ``missing_ok`` (whoever creates it creates it 0700, then checks again)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if missing_ok:
            return
        raise UnsafeDir(f"the socket directory {path} does not exist") from None
    except OSError as exc:
        raise UnsafeDir(f"cannot inspect the socket directory {path}: {exc.strerror or exc}") from None
    euid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDir(f"the socket directory {path} is a symbolic link (owned by uid {st.st_uid}); "
                        f"it must be a directory owned by uid {euid} with mode 0700")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDir(f"the socket directory {path} is not a directory")
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != euid or mode & 0o077:
        raise UnsafeDir(f"the socket directory {path} is not private: owned by uid {st.st_uid} with mode "
                        f"{mode:04o}, not by uid {euid} with mode 0700; another user could replace the socket "
                        "(remove the directory, or fix its owner and mode)")


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) unless it exists, then check it: whoever created it
    first, it is used only when it is ours and private. Raises :class:`UnsafeDir`, or
    OSError when it cannot be created."""
    check_private_dir(path, missing_ok=True)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(path)
