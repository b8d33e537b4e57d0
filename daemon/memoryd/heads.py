"""The ledger's heads, witnessed outside the store.

A process with the user's rights can truncate the ledger cleanly, or rewrite it whole with
recomputed hashes, and the chain alone still checks out. So at start, at stop, and every
``heads_every_rows`` rows or ``heads_every_s`` seconds of writing, the daemon appends its
head as one JSON line to the store's heads file (memoryd_protocol.paths.heads_path_for) and
logs it (under systemd, the log is the journal, which a same-uid process cannot rewrite).
``memoryctl audit verify --heads FILE`` checks that every head witnessed is still in the
chain; ``memoryctl audit heads`` prints them, for a copy kept elsewhere.

The file is read and written on a worker thread, never on the event loop, and only as
memoryd_protocol.heads_file opens it: anything else found at its path is refused, said once
in the log, and the heads go to the log alone. A start reads only the file's tail.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Literal

import anyio
import msgspec
from memoryd_protocol.audit_types import StoreFile, WitnessedHead, parse_heads
from memoryd_protocol.heads_file import HEADS_TAIL_BYTES, HeadsFileRefused, append_head, read_heads_tail
from memoryd_protocol.paths import heads_path_for

log = logging.getLogger("memoryd.heads")

Event = Literal["start", "stop", "every"]


class Heads:
    """Where this daemon witnesses its store's heads (``path`` None: nowhere, the log only)."""

    def __init__(self, store: Path, every_rows: int, every_s: float) -> None:
        self.store = store.resolve()
        self.path = heads_path_for(self.store)
        self.every_rows, self.every_s = every_rows, every_s
        self._n = 0
        self._at = time.monotonic()
        #: the refusal last logged (None: the file was used, or never refused), so that each
        #: is logged once however many heads it turns away
        self._refused: str | None = None
        #: the newest periodic head not yet appended, and what wakes ``run`` for it
        self._queued: bytes | None = None
        self._wake = anyio.Event()

    async def last(self) -> WitnessedHead | None:
        """The last head witnessed for this store (a ``stop`` one after a clean stop)."""
        return None if self.path is None else await anyio.to_thread.run_sync(self._last, self.path)

    def _last(self, path: Path) -> WitnessedHead | None:
        try:
            data, size = read_heads_tail(path, HEADS_TAIL_BYTES)
        except FileNotFoundError:
            return None
        except HeadsFileRefused as exc:
            # Refused, it may hold anything: a forged stop head would let a changed store pass
            # as the one memoryd left.
            self._refuse(exc, "the start trusts no stop head from it, and checks the store without it")
            return None
        except OSError as exc:
            log.warning("the heads file %s cannot be read (%s): the start checks the store without it", path,
                        exc.strerror or exc)
            return None
        heads = parse_heads(data, str(self.store))
        if size > HEADS_TAIL_BYTES:
            log.info("the heads file %s holds %d bytes: the start reads its last %d only", path, size,
                     HEADS_TAIL_BYTES)
            if not heads:
                log.warning("no head of this store in the last %d bytes of the heads file %s: the start checks the "
                            "store without a stop head; memoryctl audit verify --heads %s checks every head in it",
                            HEADS_TAIL_BYTES, path, path)
        return heads[-1] if heads else None

    def untouched(self, stop: WitnessedHead | None) -> bool:
        """Before the store is opened: nobody wrote it since the clean stop ``stop`` recorded."""
        return stop is not None and stop.file is not None and stop.file == self._file()

    def _file(self) -> StoreFile | None:
        """The store file's identity and status-change time, when no WAL holds more of it."""
        try:
            st = os.stat(self.store)
            if os.path.exists(f"{self.store}-wal") and os.stat(f"{self.store}-wal").st_size:
                return None
        except OSError:
            return None
        return StoreFile(ino=st.st_ino, size=st.st_size, ctime_ns=st.st_ctime_ns)

    def _line(self, head: tuple[int, str] | None, event: Event) -> bytes | None:
        """Log ``head``; its line for the heads file (None: nothing to append)."""
        if head is None:
            return None
        self._n, self._at = head[0], time.monotonic()
        log.info("ledger head at %s: row %d hash %s", event, head[0], head[1])
        if self.path is None:
            return None
        return msgspec.json.encode(WitnessedHead(store=str(self.store), n=head[0], hash=head[1],
                                                 ts=time.time_ns() // 1_000_000, event=event,
                                                 file=self._file() if event == "stop" else None)) + b"\n"

    async def witness(self, head: tuple[int, str] | None, event: Event) -> None:
        """Witness ``head`` now (at start and stop), on disk before returning."""
        line = self._line(head, event)
        if line is not None:
            await anyio.to_thread.run_sync(self._append, line, True)

    def committed(self, head: tuple[int, str] | None) -> None:
        """After a commit, on the event loop: once ``every_rows`` rows or ``every_s`` seconds
        passed, log the head and queue its line for ``run``."""
        if head is not None and (head[0] - self._n >= self.every_rows or time.monotonic() - self._at >= self.every_s):
            line = self._line(head, "every")
            if line is not None:
                self._queued = line  # a newer head vouches for the older one still queued
                self._wake.set()

    async def run(self) -> None:
        """Append the queued periodic heads, one at a time, until cancelled (a line being
        appended is finished first, so the stop head stays the file's last)."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            line, self._queued = self._queued, None
            if line is not None:
                await anyio.to_thread.run_sync(self._append, line, False)

    def _append(self, line: bytes, sync: bool) -> None:
        """On a worker thread: ``line`` appended to the heads file, or the reason logged."""
        assert self.path is not None
        try:
            append_head(self.path, line, sync=sync)
        except HeadsFileRefused as exc:
            self._refuse(exc, "until it is, the ledger heads are witnessed in this log only")
            return
        except OSError as exc:
            log.warning("the ledger head could not be witnessed in %s: %s", self.path, exc.strerror or exc)
            return
        if self._refused is not None:
            self._refused = None
            log.warning("the heads file %s is a regular file of memoryd's user again: the ledger heads are witnessed "
                        "there again", self.path)

    def _refuse(self, exc: HeadsFileRefused, meanwhile: str) -> None:
        if str(exc) != self._refused:
            self._refused = str(exc)
            log.error("%s (%s)", exc, meanwhile)
