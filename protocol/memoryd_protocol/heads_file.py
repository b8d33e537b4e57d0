"""Opening the heads file (paths.default_heads_path), for the daemon that appends to it and
memoryctl that reads it: never through a symbolic link (its own name or its directory's),
never blocking, and only a regular file of this user's with one link that no other user can
write, in a directory others cannot write. A process of the user's that replaced it with a
FIFO would otherwise block whoever opens it, a link would send the heads into another file,
and a file or directory others can write lets them forge or remove the heads."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: the most a start reads of the heads file, from its end: the newest heads are what it
#: checks, and a file grown without bound must not make it read all (about 5,000 heads)
HEADS_TAIL_BYTES = 1 << 20

#: what an lstat or fstat that is no regular file shows, as a refusal names it
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class HeadsFileRefused(OSError):
    """The heads file is not one memoryd keeps heads in; the message names the path, what
    was there, and the next step."""

    def __init__(self, path: Path, found: str, message: str | None = None) -> None:
        super().__init__(message or f"the heads file {path} {found}: memoryd keeps ledger heads only in a regular file "
                         "with one link that its own user owns; remove it, and memoryd writes a new one at its next "
                         "head")
        self.path, self.found = path, found


def _writable(path: Path, st: os.stat_result) -> HeadsFileRefused:
    mode = stat.S_IMODE(st.st_mode)
    return HeadsFileRefused(path, "is writable by its group or others", (
        f"the heads file {path} is writable by its group or others (mode {mode:04o}): memoryd keeps ledger heads only "
        f"in a file no other user can write; check it with memoryctl audit verify --heads {path}, then chmod 600 "
        f"{path} or remove it, and memoryd witnesses there again at its next head"))


def _directory(path: Path) -> int:
    """The heads file's directory, opened without following a link: the file is then opened
    relative to it, so no link anywhere at its end redirects the heads. HeadsFileRefused when
    it is a link, or others may write it (and so remove or replace the file)."""
    directory = path.parent
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError:
        try:
            link = stat.S_ISLNK(os.lstat(directory).st_mode)
        except OSError:
            link = False
        if not link:
            raise
        raise HeadsFileRefused(path, "is in a linked directory", (
            f"the heads file's directory {directory} is a symbolic link: memoryd keeps ledger heads only in a "
            "directory it reaches without following a link; remove the link, and memoryd makes the directory anew at "
            "its next head")) from None
    st = os.fstat(dfd)
    # The sticky bit keeps others from removing or renaming a file of this user's.
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        os.close(dfd)
        raise HeadsFileRefused(path, "is in a directory others can write", (
            f"the heads file's directory {directory} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"they could remove or replace the heads file; chmod o-w {directory}, and memoryd witnesses there again at "
            "its next head"))
    return dfd


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
    dfd = _directory(path)
    try:
        return _open_in(dfd, path, flags)
    finally:
        os.close(dfd)


def _open_in(dfd: int, path: Path, flags: int) -> int:
    try:
        # O_NONBLOCK: opening a FIFO returns at once (for writing, ENXIO while nobody reads
        # it) instead of waiting for a peer; on a regular file it changes nothing.
        fd = os.open(path.name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    except FileNotFoundError:
        raise
    except OSError:
        try:
            found = _problem(os.stat(path.name, dir_fd=dfd, follow_symlinks=False))
        except OSError:
            found = None
        if found is None:
            raise
        raise HeadsFileRefused(path, found) from None
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    found = _problem(st)
    if found is not None:
        os.close(fd)
        raise HeadsFileRefused(path, found)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise _writable(path, st)
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


def read_heads_tail(path: Path, limit: int = HEADS_TAIL_BYTES) -> tuple[bytes, int]:
    """The whole lines in the last ``limit`` bytes of the heads file ``path``, and its size;
    FileNotFoundError when there is none."""
    fd = _open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        # One byte more than the tail: when it ends a line, the tail starts with a whole one.
        start = size - limit - 1 if size > limit else 0
        chunks, at = [], start
        while at < size and (chunk := os.pread(fd, min(1 << 20, size - at), at)):
            chunks.append(chunk)
            at += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if size > limit:
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    return data, size


def append_head(path: Path, line: bytes, *, sync: bool) -> None:
    """Append ``line`` to the heads file ``path``, creating it (and its directory, 0700) when
    missing; ``sync``: on disk before returning."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        pass  # a dangling link where the directory goes: _open names it
    fd = _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["HEADS_TAIL_BYTES", "HeadsFileRefused", "append_head", "read_heads_file", "read_heads_tail"]
