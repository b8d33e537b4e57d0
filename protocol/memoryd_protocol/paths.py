"""Default locations shared by the daemon and its clients (so ``memoryctl`` finds the
socket that ``memoryd serve`` opened without either importing the other)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import NamedTuple

import platformdirs

APP = "memoryd"


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/memoryd``, else ``<tmp>/memoryd-<uid>``; created 0700 by the daemon."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / APP
    import tempfile  # only without XDG_RUNTIME_DIR: the relay and memoryctl start without it

    return Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}"


def default_socket_path() -> Path:
    """``$MEMORYD_SOCKET`` when set, else the per-user socket inside the 0700 runtime directory."""
    env = os.environ.get("MEMORYD_SOCKET")
    return Path(env) if env else runtime_dir() / "memoryd.sock"


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/memoryd/memory.db`` on Linux (platformdirs' data dir elsewhere)."""
    return platformdirs.user_data_path(APP) / "memory.db"


def default_config_path() -> Path:
    """``$XDG_CONFIG_HOME/memoryd/config.toml`` on Linux (platformdirs' config dir elsewhere)."""
    return platformdirs.user_config_path(APP) / "config.toml"


def default_heads_path() -> Path | None:
    """``$XDG_STATE_HOME/memoryd/heads``: where the daemon witnesses the default store's
    ledger heads (memoryd.heads); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    return platformdirs.user_state_path(APP) / "heads"


#: beside a store other than the default one, the file its heads are witnessed in
HEADS_SUFFIX = ".memoryd-heads"


def heads_path_for(db: Path) -> Path | None:
    """Where the heads of the store ``db`` are witnessed: the default store's in
    :func:`default_heads_path` (the user's witness), any other's beside it,
    ``<db>.memoryd-heads``. A scratch or test store then never writes into the user's
    witness, and its heads go when its directory goes. Decided by the resolved path alone,
    so memoryctl finds the file the daemon writes from the store's path."""
    store = Path(db).resolve()
    if store == default_db_path().resolve():
        return default_heads_path()
    return store.with_name(store.name + HEADS_SUFFIX)


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


#: The owner record: ``pid``; ``socket``, None when the holder serves no socket; ``stopping``,
#: set by a holder that is letting go of the store, so a starter waits for it. Made from the
#: types themselves: a class body's annotations are strings in this module, which typing would
#: compile at import, and the relay's start (which reads this record) compiles nothing else.
OwnerRecord = NamedTuple("OwnerRecord", [("pid", int), ("socket", str | None), ("stopping", bool)])  # noqa: UP014


def read_owner_record(db: Path) -> OwnerRecord | None:
    """The owner record of the store ``db`` (:func:`owner_record_path`), or None when there
    is none or it is not one memoryd writes: a JSON object whose pid is a positive integer.
    A socket that is not a string reads as None. Strict for every reader: a record someone
    else wrote must not name a pid to wait on or a socket to follow."""
    try:
        info = json.loads(owner_record_path(db).read_bytes())
    except (OSError, ValueError):
        return None
    pid = info.get("pid") if isinstance(info, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    socket = info.get("socket")
    return OwnerRecord(pid, socket if isinstance(socket, str) else None, info.get("stopping") is True)


#: next to the socket: held by whoever is starting a daemon there (memoryd.launch)
AUTOSTART_LOCK_NAME = ".memoryd-autostart.lock"


def temporary_twin(path: Path) -> Path:
    """The name a file is written under before it is renamed over ``path`` (the owner
    record, the socket): ``.<name>.<pid>`` beside it."""
    return path.with_name(f".{path.name}.{os.getpid()}")


def store_files(db: Path) -> tuple[Path, ...]:
    """Every file the daemon serving the store ``db`` writes for it: the store, SQLite's
    journals beside it, the owner record (and its temporary twin, renamed over it), and the
    heads file. The systemd unit leaves each one's directory writable
    (memoryd.units), and its tests hold the daemon to this list."""
    owner = owner_record_path(db)
    heads = heads_path_for(db)
    return (db, *(db.with_name(db.name + s) for s in ("-wal", "-shm", "-journal")), owner, temporary_twin(owner),
            *(() if heads is None else (heads,)))


def runtime_files(socket_path: Path) -> tuple[Path, ...]:
    """Every file written next to the socket ``socket_path``: the socket (and its temporary
    twin, renamed over it), the log of a daemon started in the background, and the
    autostart lock."""
    return (socket_path, temporary_twin(socket_path), log_path_for(socket_path),
            socket_path.with_name(AUTOSTART_LOCK_NAME))


# --- the approver key (approvers = "keyed") ---------------------------------------------------

APPROVER_KEY_NAME = "approver.key"
#: what an approver's proof is the HMAC of: this tag, the nonce, the connection, the pid, its start time
PROOF_TAG = "memoryd-approver-v2"


class ApproverKeyError(ValueError):
    """The approver key cannot be used: missing, not private, or not a key (the message says
    which, and what to do)."""


def approver_key_path() -> Path:
    """``$XDG_CONFIG_HOME/memoryd/approver.key``: the key both the daemon and a keyed
    approver read (they run as one user)."""
    return default_config_path().with_name(APPROVER_KEY_NAME)


def read_approver_key(path: Path) -> bytes:
    """The key in ``path``: a regular file of this user's, readable by nobody else, holding
    64 hex digits. Never through a symbolic link, which another path could be swapped in for."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ApproverKeyError(f"the approver key {path} does not exist: create it with memoryctl approve "
                               "--init-key") from None
    except OSError as exc:
        if os.path.islink(path):
            raise ApproverKeyError(f"the approver key {path} is a symbolic link: put the key file itself there "
                                   "(memoryctl approve --init-key makes one)") from None
        raise ApproverKeyError(f"cannot read the approver key {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ApproverKeyError(f"the approver key {path} is not a regular file: remove it and run memoryctl "
                                   "approve --init-key")
        if st.st_uid != os.geteuid():
            raise ApproverKeyError(f"the approver key {path} is owned by uid {st.st_uid}, not {os.geteuid()}: "
                                   "remove it and run memoryctl approve --init-key")
        if st.st_mode & 0o077:
            raise ApproverKeyError(f"the approver key {path} is readable by group or others (mode "
                                   f"{stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}, or remove it and run "
                                   "memoryctl approve --init-key")
        text = os.read(fd, 256).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32 or len(text) != 64:
        raise ApproverKeyError(f"the approver key {path} is not a memoryd approver key (64 hex digits): remove it "
                               "and run memoryctl approve --init-key")
    return key


def create_approver_key(path: Path) -> None:
    """Write a new random key to ``path`` (mode 0600, its directory made 0700 if missing);
    FileExistsError when there is one already: replacing a key is the user's decision."""
    import secrets  # the key's crypto: only the verbs that make or prove a key import it

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def approver_proof(key: bytes, nonce: str, connection: str, pid: int, start: int) -> str:
    """``approval/prove``'s proof of ``key`` for one challenge (approval_types.ApprovalChallenge):
    hex HMAC-SHA256 of the tag, nonce, connection, pid and start time, NUL-separated."""
    import hashlib
    import hmac

    message = "\0".join((PROOF_TAG, nonce, connection, str(pid), str(start))).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


__all__ = ["APPROVER_KEY_NAME", "AUTOSTART_LOCK_NAME", "HEADS_SUFFIX", "LOG_NAME", "PROOF_TAG", "ApproverKeyError", "OwnerRecord", "approver_key_path", "approver_proof",
           "create_approver_key", "default_config_path", "default_db_path", "default_heads_path",
           "default_socket_path", "heads_path_for", "log_path_for", "owner_record_path",
           "read_approver_key", "read_owner_record", "runtime_dir", "runtime_files", "store_files", "temporary_twin"]
