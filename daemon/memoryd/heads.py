"""The ledger's heads, witnessed outside the store.

A process with the user's rights can truncate the ledger cleanly, or rewrite it whole with
recomputed hashes, and the chain alone still checks out. So at start, at stop, and every
``heads_every_rows`` rows or ``heads_every_s`` seconds of writing (config), the daemon appends its head ``{store, n,
hash, ts, event}`` as one JSON line to ``$XDG_STATE_HOME/memoryd/heads`` and logs it (under
systemd, the log is the journal, which a same-uid process cannot rewrite).
``memoryctl audit verify --heads FILE`` checks that every head witnessed is still in the
chain; ``memoryctl audit heads`` prints them, for a copy kept elsewhere.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Literal

import msgspec
from memoryd_protocol.audit_types import StoreFile, WitnessedHead, parse_heads
from memoryd_protocol.paths import default_heads_path

log = logging.getLogger("memoryd.heads")

Event = Literal["start", "stop", "every"]

def read(path: Path, store: Path) -> list[WitnessedHead]:
    """The heads ``path`` holds for ``store``, oldest first."""
    try:
        return parse_heads(path.read_bytes(), str(store))
    except FileNotFoundError:
        return []


class Heads:
    """Where this daemon witnesses its store's heads (``path`` None: nowhere, the log only)."""

    def __init__(self, store: Path, every_rows: int, every_s: float, path: Path | None = None) -> None:
        self.store = store.resolve()
        self.path = path if path is not None else default_heads_path()
        self.every_rows, self.every_s = every_rows, every_s
        self._n = 0
        self._at = time.monotonic()

    def last(self) -> WitnessedHead | None:
        """The last head witnessed for this store (a ``stop`` one after a clean stop)."""
        if self.path is None:
            return None
        try:
            heads = read(self.path, self.store)
        except OSError:
            log.warning("the heads file %s cannot be read: the start checks the store without it", self.path)
            return None
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

    def witness(self, head: tuple[int, str] | None, event: Event) -> None:
        if head is None:
            return
        self._n, self._at = head[0], time.monotonic()
        log.info("ledger head at %s: row %d hash %s", event, head[0], head[1])
        if self.path is None:
            return
        line = msgspec.json.encode(WitnessedHead(store=str(self.store), n=head[0], hash=head[1],
                                                 ts=time.time_ns() // 1_000_000, event=event,
                                                 file=self._file() if event == "stop" else None)) + b"\n"
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line)
                if event != "every":
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("the ledger head could not be witnessed in %s: %s", self.path, exc.strerror or exc)

    def committed(self, head: tuple[int, str] | None) -> None:
        """After a commit: witness the head once ``every_rows`` rows or ``every_s`` seconds passed."""
        if head is not None and (head[0] - self._n >= self.every_rows or time.monotonic() - self._at >= self.every_s):
            self.witness(head, "every")
