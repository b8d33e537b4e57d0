"""A replica seen from memoryctl: a copy of it made by ``memoryd replica restore URL --to
PATH`` (the daemon's one module that runs Litestream: memoryctl never runs it itself), its
newest ledger row, and that row as the witness ``memoryctl audit verify --against URL``
checks the local chain against. Imported only by restore and verify --against.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from memoryd_protocol import types as T
from memoryd_protocol.ledger import Fetch
from memoryd_protocol.replica_chain import Head

from . import offline
from .errors import ClientError
from .running import Ctx

#: the newest ledger row of a store
SELECT_HEAD = "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1"
#: how long one ``memoryd replica restore`` may take (a large store from a slow bucket)
RESTORE_TIMEOUT_S = 3600.0


class ReplicaUnavailable(ClientError):
    """The replica could not be copied (unreachable, empty, no Litestream): exit 3."""

    CODE = "REPLICA_UNAVAILABLE"


def copy_replica(ctx: Ctx, url: str, dest: Path) -> None:
    """``memoryd replica restore URL --to DEST``: the replica's newest state at ``dest``, a
    path that must not exist yet. Credentials reach Litestream through the environment
    (or the config's credentials file), never this command line."""
    args = [sys.executable, "-m", "memoryd", "replica", "restore", url, "--to", str(dest)]
    if ctx.args.config:
        args += ["--config", os.path.abspath(os.path.expanduser(ctx.args.config))]
    try:
        r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RESTORE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ReplicaUnavailable(f"cannot copy the replica {url}: it took longer than {RESTORE_TIMEOUT_S:g}s", {"url": url}) from None
    if r.returncode != 0:
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        reason = lines[-1].removeprefix("memoryd: ") if lines else f"memoryd exited with status {r.returncode}"
        raise ReplicaUnavailable(f"cannot copy the replica {url}: {reason}", {"url": url})
    if not dest.is_file():
        raise ReplicaUnavailable(f"cannot copy the replica {url}: memoryd replica restore left no copy", {"url": url})


def head_of(copy: Path) -> Head | None:
    """The newest ledger row of the store at ``copy`` (None: it has no ledger rows)."""
    def newest(fetch: Fetch) -> Head | None:
        row = next(iter(fetch(SELECT_HEAD)), None)
        return None if row is None else Head(int(row[0]), str(row[1]))

    try:
        return offline.read(str(copy), newest)
    except offline.NoLedger:
        return None


@contextlib.contextmanager
def private_dir(near: Path) -> Iterator[Path]:
    """A directory of this user's alone (0700) in ``near``, removed with what it holds."""
    near.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=".memoryd-restore-", dir=near))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def against(ctx: Ctx, url: str) -> Head | None:
    """``audit verify --against URL``: the replica's newest ledger row, from a copy made in
    a private temporary directory and removed again; the verify then checks it as a head
    witnessed outside the store."""
    with private_dir(Path(tempfile.gettempdir())) as tmp:
        copy = tmp / "replica.db"
        copy_replica(ctx, url, copy)
        head = head_of(copy)
    if head is None:
        print(f"memoryctl: the replica at {url} has no ledger rows yet: it witnesses nothing", file=sys.stderr)
    else:
        print(f"memoryctl: checking that this ledger extends the replica's chain at {url}: its newest row is "
              f"{head.n} (hash {head.hash[:16]})", file=sys.stderr)
    return head


def behind_hint(report: T.LedgerReport, url: str, head: Head | None) -> None:
    """When the replica holds more rows than the store, the truncation verify names may also
    be another machine's writes since: say how to take them."""
    if head is not None and not report.ok and report.rows < head.n:
        print(f"memoryctl: the replica holds rows up to {head.n} and this store {report.rows}: if another machine "
              f"wrote them, memoryctl restore {url} takes its history", file=sys.stderr)



__all__ = ["ReplicaUnavailable", "against", "behind_hint", "copy_replica", "head_of", "private_dir"]
