"""``memoryctl restore URL``: a replica's copy, verified before anything is installed.

The copy is made next to the store (replicas.copy_replica) and verified with the same
offline reader as ``audit verify --db``, against the heads witnessed for the store when
there are any; it is moved in only when it verifies and no daemon holds the store.
Imported only by that command.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import time
from pathlib import Path

import msgspec
from memoryd_protocol.audit_types import StoreFile, WitnessedHead
from memoryd_protocol.heads_file import HeadsFileRefused, append_head
from memoryd_protocol.ledger_check import read_report, with_problems
from memoryd_protocol.paths import default_db_path, heads_path_for
from memoryd_protocol.replica_chain import Head

from . import offline, render
from .auditing import _heads, _pairs
from .replicas import ReplicaUnavailable, copy_replica, head_of, private_dir
from .running import EXIT_CONNECTION, EXIT_OK, EXIT_PROTOCOL, Ctx, UsageError, _error


def _target(ctx: Ctx) -> Path:
    db = ctx.data.get("db")
    return Path(db) if db else default_db_path()


def _aside(target: Path, stamp: str) -> Path:
    return target.with_name(f"{target.name}.replaced-{stamp}")


def _lock(target: Path) -> int | None:
    """Hold the lock a daemon holds on its store (an exclusive flock on the file) while the
    copy is moved in, so that no daemon opens the store being replaced; None when there is
    no store there yet. Raises :class:`offline.StoreHeld` when a daemon holds it."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        offline.check_not_held(target)  # raises StoreHeld, naming the daemon
        raise offline.OfflineError(f"store {target} is locked by another process") from None
    return fd


def _install(copy: Path, target: Path, stamp: str) -> Path | None:
    """Move ``copy`` in at ``target`` (0600, in one rename), keeping the store it replaces
    beside it; returns where that was kept (None: there was none). The store's WAL and
    shared memory go aside first, while the lock is held: SQLite would apply an old WAL's
    pages to the new file."""
    os.chmod(copy, 0o600)
    fd = _lock(target)
    kept = None
    try:
        if fd is not None:
            kept = _aside(target, stamp)
            os.link(target, kept)
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(f"{target}{suffix}", f"{kept}{suffix}")
        os.replace(copy, target)
        dirfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)
    finally:
        if fd is not None:
            os.close(fd)
    return kept


def _witness(target: Path, head: Head, heads_file: Path | None) -> None:
    """Append the restored head to the store's heads file, as a stop head with the file as
    it was installed: the daemon's next start then takes the store as verified here, its
    rows as memoryd's own, instead of taking the rows after the last stop as another
    program's."""
    if heads_file is None:
        return
    st = os.stat(target)
    line = msgspec.json.encode(WitnessedHead(
        store=str(target.resolve()), n=head.n, hash=head.hash, ts=time.time_ns() // 1_000_000, event="stop",
        file=StoreFile(ino=st.st_ino, size=st.st_size, ctime_ns=st.st_ctime_ns))) + b"\n"
    try:
        append_head(heads_file, line, sync=True)
    except (HeadsFileRefused, OSError) as exc:
        print(f"memoryctl: the restored head could not be witnessed in {heads_file}: {exc}", file=sys.stderr)


def cmd_restore(ctx: Ctx) -> int:
    """``memoryctl restore URL [--db PATH] [--heads FILE | --no-heads]``."""
    a = ctx.args
    url: str = a.url
    target = _target(ctx).absolute()
    if a.heads and a.no_heads:
        raise UsageError("restore: give --heads FILE or --no-heads, not both")
    if target.exists() and not target.is_file():
        raise UsageError(f"{target} is not a file")
    try:
        if target.exists():
            offline.check_not_held(target)  # refused before anything is copied
        heads_file = heads_path_for(target)
        witnessed: list[tuple[int, str]] = []
        if a.heads or not a.no_heads:
            witnessed = _pairs(_heads(ctx, str(target), a.heads))
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        with private_dir(target.parent) as tmp:
            copy = tmp / target.name
            copy_replica(ctx, url, copy)
            if witnessed:
                many = "head" if len(witnessed) == 1 else "heads"
                print(f"memoryctl: checking {len(witnessed)} {many} witnessed for {target} (newest: row "
                      f"{witnessed[-1][0]})", file=sys.stderr)
            report = offline.read(str(copy), lambda fetch: read_report(fetch, None, witnessed))
            report = with_problems(report, offline.index_problems(str(copy)))
            if not report.ok:
                ctx.result(report, lambda: render.ledger_report(report))
                print(f"memoryctl: the copy of {url} does not verify: nothing was installed, and {target} is "
                      "unchanged", file=sys.stderr)
                return EXIT_PROTOCOL
            head = head_of(copy)
            assert head is not None  # a report that is ok has rows
            kept = _install(copy, target, stamp)
        if a.no_heads and heads_file is not None and heads_file.exists():
            # the heads that witnessed the history just replaced go with it
            aside = heads_path_for(kept) if kept is not None else None
            shutil.move(heads_file, aside or heads_file.with_name(f"{heads_file.name}.replaced-{stamp}"))
        _witness(target, head, heads_file)
    except ReplicaUnavailable as exc:
        _error(ctx, exc.code, f"{exc.message}; {target} is unchanged", exc.details)
        return EXIT_CONNECTION
    except offline.StoreHeld as exc:
        raise UsageError(f"{exc}: stop it first (memoryctl stop), then restore; {target} is unchanged") from None
    except offline.NoLedger:
        _error(ctx, "NO_LEDGER", f"the replica {url} holds a store with no ledger: nothing proves it; {target} is "
               "unchanged", {"url": url})
        return EXIT_PROTOCOL
    except offline.OfflineError as exc:
        raise UsageError(f"{exc}; {target} is unchanged") from None
    done = {"store": str(target), "url": url, "rows": head.n, "head": head.hash,
            "replaced": None if kept is None else str(kept)}
    ctx.result(done, lambda: f"restored {url} into {target}: ledger rows 1–{head.n} verified (head "
               f"{head.hash[:16]})" + ("" if kept is None else f"; the store it replaces is kept as {kept}"))
    return EXIT_OK


__all__ = ["cmd_restore"]
