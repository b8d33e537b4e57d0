"""Opening the heads file (paths.default_heads_path), for the daemon that appends to it and
memoryctl that reads it: never through a symbolic link, never blocking, and only a regular
file of this user's with one link. A process of the user's that replaced it with a FIFO
would otherwise block whoever opens it, and a link would send the heads into another file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: what an lstat or fstat that is no regular file shows, as a refusal names it
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class HeadsFileRefused(OSError):
    """The heads file is not one memoryd keeps heads in; the message names the path, what
    was there, and the next step."""

    def __init__(self, path: Path, found: str) -> None:
        super().__init__(f"the heads file {path} {found}: memoryd keeps ledger heads only in a regular file with one "
                         "link that its own user owns; remove it, and memoryd writes a new one at its next head")
        self.path, self.found = path, found


def _problem(st: os.stat_result) -> str | None:
    """What makes ``st`` no heads file, or None."""
    for test, kind in _KINDS:
        if test(st.st_mode):
            return f"is {kind}"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} links"
    return None


def _open(path: Path, flags: int) -> int:
    """``path`` opened with ``flags``: FileNotFoundError when there is none, HeadsFileRefused
    when it is no heads file."""
    try:
        # O_NONBLOCK: opening a FIFO returns at once (for writing, ENXIO while nobody reads
        # it) instead of waiting for a peer; on a regular file it changes nothing.
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        raise
    except OSError:
        try:
            found = _problem(os.lstat(path))
        except OSError:
            found = None
        if found is None:
            raise
        raise HeadsFileRefused(path, found) from None
    try:
        found = _problem(os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    if found is not None:
        os.close(fd)
        raise HeadsFileRefused(path, found)
    return fd


def read_heads_file(path: Path) -> bytes:
    """Everything the heads file ``path`` holds; FileNotFoundError when there is none."""
    fd = _open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def append_head(path: Path, line: bytes, *, sync: bool) -> None:
    """Append ``line`` to the heads file ``path``, creating it (and its directory, 0700) when
    missing; ``sync``: on disk before returning."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["HeadsFileRefused", "append_head", "read_heads_file"]
