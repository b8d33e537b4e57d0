"""The daemon's Litestream: started once the store is open, supervised, stopped after the drain.

One ``litestream replicate`` process ships the store's WAL to the replica. When it exits
(a crash, a kill), it is started again after a back-off that doubles from
``restart_min_s`` up to ``restart_max_s``. Another task reads the replica's newest ledger
row (a restore into a temporary file) every ``lag_every_s`` while the replica may lack rows
(a commit moved the head since it last held it), which gives the lag ``daemon/status``
shows: rows, and seconds since the oldest row the replica lacks was committed. Each such
read is also judged as the start's "no two writers" check is (replica_guard): a replica
whose newest row is not of this store's chain (another machine took it over) ends
Litestream at once, for good, with the same ERROR. Each change of state is one log line
naming the replica without its secrets; Litestream's own lines go to the debug log.

Checkpoints: Litestream holds a read transaction on the store between its syncs, so no
checkpoint (memoryd's automatic ones, or the PASSIVE one at close) moves a page it has not
copied yet back into the database file, nor restarts the WAL under it; it checkpoints
itself after its copies. So the writer leaves the checkpoints to Litestream (a high
automatic threshold, WRITER_AUTOCHECKPOINT_PAGES), and the daemon stops Litestream only
after the drain and before the store closes, so that its last sync holds every write the
daemon acknowledged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process
from memoryd_protocol import replica_chain
from memoryd_protocol.replication_types import ReplicationState, ReplicationStatus

from . import litestream, replica_guard
from .replica import Replica, ReplicaError
from .tx import Tx

log = logging.getLogger("memoryd.replication")

#: The longest the stop waits for Litestream's last sync before it is killed: within the
#: five seconds a stopping daemon is given, after the drain (app.DRAIN_S).
STOP_WAIT_S = 1.5
#: Litestream's options unless [replicate.litestream] sets them: its own last sync at a stop
#: is bounded, and it checkpoints every 8,000 WAL pages rather than 1,000. Each of its
#: checkpoints commits to its own table, which makes the writer compare the store whole
#: (foreign.py): at 1,000 pages, a few hundred writes apart under load.
_DEFAULTS = (("top", "shutdown-sync-timeout", "1s"), ("db", "min-checkpoint-page-count", 8_000))
#: a Litestream that ran this long before it exited restarts after restart_min_s again
_HEALTHY_S = 60.0
#: Litestream opens the store at its first look at the WAL (each ``monitor-interval``, 1 s by
#: default), and one stopped before that syncs nothing at its stop: a Litestream younger
#: than this, or none running, is followed at the stop by one ``replicate -once``
_FRESH_S = 3.0

#: The writer's automatic checkpoint threshold while Litestream runs, in WAL pages (SQLite's
#: default is 1,000): Litestream's read transaction keeps any other checkpoint from
#: restarting the WAL, so every commit past the threshold would try one, mostly in vain.
#: Litestream's guidance is a threshold above its own (``_DEFAULTS``), so that it
#: checkpoints; this one still bounds the WAL (about 64 MB of 4 kB pages) while it is down.
WRITER_AUTOCHECKPOINT_PAGES = 16_000


def _leave_checkpoints_to_litestream(tx: Tx) -> None:
    tx.conn.execute(f"PRAGMA wal_autocheckpoint = {WRITER_AUTOCHECKPOINT_PAGES}")


#: (n, hash) of the local ledger's head, None for an empty ledger
Head = tuple[int, str] | None
#: reads the store (Service.read)
Read = Callable[[Callable[[Any], Any]], Awaitable[Any]]
#: runs a job on the writer's connection (Writer.submit)
Submit = Callable[[Callable[[Tx], None]], Awaitable[None]]


def _secret_values(replica: Replica) -> list[str]:
    """The credentials' values long enough to scrub from what Litestream says."""
    return [v for v in replica.credentials.values() if len(v) >= 4]


class Replication:
    """Litestream for one store: ``bind``, then ``run`` in the daemon's task group, ``stop``
    after the drain."""

    _read: Read
    _submit: Submit

    def __init__(self, replica: Replica, db: Path) -> None:
        litestream.binary()  # a missing extra stops the start here, naming it
        given = {name for _, name, _ in replica.options}
        defaults = tuple(o for o in _DEFAULTS if o[1] not in given)
        replica = Replica(**{**replica.__dict__, "options": (*replica.options, *defaults)})
        self.replica = replica
        self.db = db
        self.state: ReplicationState = "starting"
        self.error: str | None = None
        self.restarts = 0
        self.replica_head: replica_chain.Head | None = None
        self.read_at: int | None = None
        self._head: Callable[[], Head] = lambda: None
        self._proc: Process | None = None
        self._started_at = 0.0
        self._dir: str | None = None
        self._config: Path | None = None
        self._stopping = False
        self._scope = anyio.CancelScope()
        #: the local head the replica last held in full (None: not read yet)
        self._held: Head = None
        #: the credentials' values as last read: what Litestream's errors may still quote
        #: after the file has changed into one memoryd refuses
        self._secrets = _secret_values(replica)

    def bind(self, head: Callable[[], Head], read: Read, submit: Submit) -> None:
        """Where the local head and the store's rows are read (the writer's anchor, Service.read),
        and how a job runs on the writer's connection (Writer.submit)."""
        self._head, self._read, self._submit = head, read, submit

    def _set(self, state: ReplicationState, detail: str = "") -> None:
        if state == self.state or (self.state == "diverged" and state != "stopped"):
            return
        self.state = state
        log.info("replication to %s: %s%s", self.replica.shown_url, state, f" ({detail})" if detail else "")

    def _scrub(self, text: str) -> str:
        """``text`` without any credential's value (Litestream's errors may quote a request)."""
        # The file may have changed since Litestream read it, into one memoryd refuses (a
        # chmod, a rotation half done): the values last read then still count.
        with contextlib.suppress(ReplicaError):
            self._secrets = _secret_values(self.replica.reload_credentials())
        for value in self._secrets:
            text = text.replace(value, "***")
        return text[:500]

    async def run(self) -> None:
        with self._scope:
            await self._submit(_leave_checkpoints_to_litestream)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._measure)
                await self._supervise()
                tg.cancel_scope.cancel()

    async def _supervise(self) -> None:
        backoff = self.replica.restart_min_s
        # Litestream's config lives here until the stop's last sync has run (``stop`` removes it)
        tmp = self._dir = tempfile.mkdtemp(prefix="memoryd-litestream-")
        while not self._stopping:
            started = time.monotonic()
            try:
                # No two writers: the replica's newest ledger row must be one of this store's
                # chain, checked before each start (replica_guard).
                await replica_guard.read(self.replica, self.db)
                replica = self.replica.reload_credentials()
                config = self._config = litestream.write_config(Path(tmp), self.db, replica)
                proc = await anyio.open_process(litestream.argv("replicate", config, replica),
                                                env=litestream.environment(replica), stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                start_new_session=True)
            except replica_guard.ReplicaDiverged as exc:
                self._diverged(exc)
                return  # never started over another machine's history; a start after the restore checks again
            except (OSError, ValueError, litestream.LitestreamError) as exc:
                self.error = self._scrub(str(exc))
                rc: int | None = None
            else:
                self._proc, self._started_at = proc, time.monotonic()
                log.debug("litestream started (pid %d)", proc.pid)
                if self.restarts and self.state == "restarting":
                    self._set("starting")
                await self._follow(proc)
                rc = await proc.wait()
                self._proc = None
            if self._stopping or self.state == "diverged":
                break
            if time.monotonic() - started >= _HEALTHY_S:
                backoff = self.replica.restart_min_s
            self.restarts += 1
            self._set("restarting", f"Litestream exited with status {rc}; starting it again in {backoff:g} s"
                      if rc is not None else f"{self.error}; trying again in {backoff:g} s")
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, self.replica.restart_max_s)

    def _diverged(self, exc: replica_guard.ReplicaDiverged) -> None:
        """Another machine's history is in the replica (the store is behind it or diverged
        from it): one ERROR naming both heads and the restore, and this daemon's Litestream
        ends at once (killed: a SIGTERM would ship one more sync over it) and is never
        started again, nor run for a last sync at the stop."""
        self.error = str(exc)
        log.error("%s", exc)
        self._set("diverged")
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    async def _follow(self, proc: Process) -> None:
        """Litestream's stderr, a JSON object a line: an error is the replica's state."""
        assert proc.stderr is not None
        buffered = b""
        async for chunk in proc.stderr:
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                self._said(line.decode("utf-8", "replace"))

    def _said(self, line: str) -> None:
        try:
            said = json.loads(line)
            level, msg = str(said.get("level", "")), str(said.get("msg", ""))
        except (ValueError, AttributeError):
            level, msg, said = "", line, {}
        log.debug("litestream: %s", self._scrub(line))
        if level == "ERROR":
            self.error = self._scrub(f"{msg}: {said['error']}" if said.get("error") else msg)
            self._set("unreachable", self.error)

    async def _measure(self) -> None:
        """Read the replica's head whenever it may lack rows, every lag_every_s at most."""
        every = self.replica.lag_every_s
        while True:
            local = self._head()
            if self._held is not None and local == self._held and self.state == "replicating":
                await anyio.sleep(every)  # nothing committed since the replica held the head
                continue
            try:
                _, head = await replica_guard.read(self.replica, self.db, timeout_s=self.replica.read_timeout_s)
            except replica_guard.ReplicaDiverged as exc:
                self._diverged(exc)
                return
            except (litestream.LitestreamError, ReplicaError, OSError) as exc:
                self.error = self._scrub(str(exc))
                self._set("unreachable", self.error)
            else:
                log.debug("replica read: %s (local head %s)", head, local)
                self.replica_head, self.read_at = head, time.time_ns() // 1_000_000
                held = local is None or (head is not None and head.n >= local[0])
                if held:
                    self._held = local
                if self._proc is None:
                    pass  # Litestream is not running: the state stays "restarting"
                elif held:
                    self.error = None
                    self._set("replicating")
                else:
                    assert local is not None
                    self._set("behind", f"{local[0] - (head.n if head else 0)} rows")
            await anyio.sleep(every)

    async def stop(self) -> None:
        """After the drain: Litestream's last sync (bounded), then it ends; ``run`` returns."""
        self._stopping = True
        proc = self._proc
        # a replica found diverged gets no last sync from this store
        fresh = self.state != "diverged" and (proc is None or time.monotonic() - self._started_at < _FRESH_S)
        with anyio.move_on_after(STOP_WAIT_S):
            if proc is not None and proc.returncode is None and self.state != "diverged":
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                await proc.wait()
            if fresh and self._config is not None and self._config.exists():
                await self._once(self._config)
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with anyio.CancelScope(shield=True):
                await proc.wait()
        self._scope.cancel()  # a read of the replica in flight ends with it (its Litestream killed)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._set("stopped")

    async def _once(self, config: Path) -> None:
        """``litestream replicate -once``: one sync of the store as the drain left it."""
        try:
            replica = self.replica.reload_credentials()
            argv = litestream.argv("replicate", config, replica, "-once")
            done = await anyio.run_process(argv, env=litestream.environment(replica), stdin=subprocess.DEVNULL,
                                           check=False)
        except (OSError, ReplicaError) as exc:
            log.warning("replication to %s: the last sync could not run: %s", self.replica.shown_url,
                        self._scrub(str(exc)))
            return
        if done.returncode != 0:
            said = litestream.last_error(done.stderr.decode("utf-8", "replace"))
            log.warning("replication to %s: the last sync failed: %s", self.replica.shown_url, self._scrub(said))

    async def status(self) -> ReplicationStatus:
        local = self._head()
        head_n = None if local is None else local[0]
        replica_n = None if self.replica_head is None else self.replica_head.n
        lag_rows = lag_s = None
        if self.read_at is not None:
            lag_rows = max(0, (head_n or 0) - (replica_n or 0))
            lag_s = 0.0
            if lag_rows:
                first = (replica_n or 0) + 1
                row = await self._read(lambda c: c.execute("SELECT ts FROM memoryd_ledger WHERE n = ?",
                                                           (first,)).fetchone())
                if row is not None:
                    lag_s = max(0.0, round((time.time_ns() // 1_000_000 - int(row[0])) / 1000, 3))
        return ReplicationStatus(url=self.replica.shown_url, state=self.state, head_n=head_n, replica_n=replica_n,
                                 lag_rows=lag_rows, lag_s=lag_s, read_at=self.read_at, restarts=self.restarts,
                                 error=self.error if self.state in ("unreachable", "restarting", "diverged") else None)
