"""The ``[replicate]`` section: where the store's pages are shipped, and with what secrets.

Pure settings, checked once at start: a replica URL (``file://``, ``s3://``, ``sftp://``),
the S3 endpoint and region, Litestream's own options (passed to it as written, from a
list of those that carry no secret), and a credentials file. Secrets never sit in the
config file, in a URL, in Litestream's argv or in a log line: they come from the
environment, or from a file only its owner can read, and reach Litestream through its
environment.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .errors import DaemonError

#: the name ``pip install`` takes for the optional Litestream binary
EXTRA = "dsh-memoryd[replicate]"

#: variables a credentials file may set: S3's keys (Litestream reads them from its
#: environment) and an SFTP password (its config names the variable, never the value)
CREDENTIAL_KEYS = frozenset({
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "LITESTREAM_ACCESS_KEY_ID", "LITESTREAM_SECRET_ACCESS_KEY", "LITESTREAM_SFTP_PASSWORD",
})
#: the variable an SFTP password is read from
SFTP_PASSWORD = "LITESTREAM_SFTP_PASSWORD"
SCHEMES = ("file", "s3", "sftp")

_DURATION = re.compile(r"[0-9]+(\.[0-9]+)?(ms|s|m|h)")
#: the kinds of Litestream's options, as an error names them
_BOOL, _INT, _STR = "true or false", "a non-negative integer", "a one-line string"
_DUR = 'a duration such as "1s" or "250ms"'
#: Litestream's options memoryd passes on: on the replica, or (``_DB_OPTIONS``) on the
#: database. Those that carry a secret (keys, passwords, SSE keys) are not among them.
_REPLICA_OPTIONS: dict[str, str] = {
    "sync-interval": _DUR, "validation-interval": _DUR, "force-path-style": _BOOL, "sign-payload": _BOOL,
    "require-content-md5": _BOOL, "skip-verify": _BOOL, "storage-class": _STR, "part-size": _INT,
    "concurrency": _INT, "key-path": _STR, "host-key": _STR, "concurrent-writes": _BOOL,
}
_DB_OPTIONS: dict[str, str] = {
    "monitor-interval": _DUR, "checkpoint-interval": _DUR, "busy-timeout": _DUR,
    "min-checkpoint-page-count": _INT, "truncate-page-n": _INT,
}
_TOP_OPTIONS: dict[str, str] = {"shutdown-sync-timeout": _DUR, "shutdown-sync-interval": _DUR}
_SECRET_OPTIONS = frozenset({"access-key-id", "secret-access-key", "password", "sse-customer-key",
                             "sse-customer-key-path", "account-key", "sas-token"})
#: the seconds-valued keys of the section, and their bounds
_SECONDS: dict[str, tuple[float, float]] = {
    "restart_min_s": (0.01, 3600.0), "restart_max_s": (0.01, 86400.0), "lag_every_s": (0.05, 86400.0),
    "read_timeout_s": (0.5, 86400.0),
}


class ReplicaError(DaemonError, ValueError):
    """A ``[replicate]`` setting memoryd refuses; config.py says it as a ConfigError."""


@dataclass(frozen=True)
class Replica:
    """One replica: what ``[replicate]`` says, checked. ``credentials`` is never printed."""

    url: str
    endpoint: str | None = None
    region: str | None = None
    credentials_file: Path | None = None
    #: Litestream's own options by where they go: ("replica" | "db" | "top", name, value)
    options: tuple[tuple[str, str, Any], ...] = ()
    #: the first restart of a failed Litestream waits this long, doubling up to restart_max_s
    restart_min_s: float = 1.0
    restart_max_s: float = 60.0
    #: how often the replica's newest ledger row is read while it is behind or rows were added
    lag_every_s: float = 5.0
    #: a read of the replica (a restore) not done in this long counts as the replica unreachable
    read_timeout_s: float = 60.0
    credentials: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @property
    def shown_url(self) -> str:
        """The URL as status and the log show it: without a user's password or a query."""
        return shown(self.url)

    def reload_credentials(self) -> Replica:
        """The same replica with its credentials file read again (each Litestream start)."""
        if self.credentials_file is None:
            return self
        return Replica(**{**self.__dict__, "credentials": read_credentials(self.credentials_file)})


def shown(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    if parts.username:
        host = f"{parts.username}@{host}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def read_credentials(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, blank lines) from a file only its owner may read."""
    try:
        # O_NONBLOCK: a FIFO put there opens at once, and is refused as no regular file,
        # instead of holding the daemon's loop until someone writes to it
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ReplicaError(f"[replicate] credentials_file {path}: cannot open it: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReplicaError(f"[replicate] credentials_file {path} is not a regular file")
        if st.st_uid != os.getuid():
            raise ReplicaError(f"[replicate] credentials_file {path} belongs to another user: "
                               "it must be yours, with mode 0600")
        if st.st_mode & 0o077:
            raise ReplicaError(f"[replicate] credentials_file {path} has mode {stat.S_IMODE(st.st_mode):04o}: "
                               f"others may read it; run chmod 600 {path}")
        with os.fdopen(fd, encoding="utf-8") as f:
            fd = -1
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:  # never its bytes: they may be a secret
        why = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        raise ReplicaError(f"[replicate] credentials_file {path}: cannot read it: {why}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    found: dict[str, str] = {}
    for k, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or key not in CREDENTIAL_KEYS:
            # the line is not shown: it may hold a secret
            raise ReplicaError(f"[replicate] credentials_file {path} line {k}: expected KEY=VALUE with KEY one of "
                               f"{', '.join(sorted(CREDENTIAL_KEYS))}")
        found[key] = value.strip()
    return found


def _seconds(key: str, value: Any) -> float:
    lo, hi = _SECONDS[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ReplicaError(f"[replicate] {key} must be a number of seconds from {lo} to {hi}, got {value!r}")
    return float(value)


def _option(name: str, value: Any) -> tuple[str, str, Any]:
    if name in _SECRET_OPTIONS:
        raise ReplicaError(f"[replicate.litestream] {name} is a secret: put it in the credentials_file "
                           f"(one of {', '.join(sorted(CREDENTIAL_KEYS))}) or the environment")
    for where, table in (("replica", _REPLICA_OPTIONS), ("db", _DB_OPTIONS), ("top", _TOP_OPTIONS)):
        kind = table.get(name)
        if kind is None:
            continue
        ok = {_BOOL: isinstance(value, bool),
              _INT: isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 40,
              _STR: isinstance(value, str) and 0 < len(value) <= 4096 and "\n" not in value,
              _DUR: isinstance(value, str) and _DURATION.fullmatch(value) is not None}[kind]
        if not ok:
            raise ReplicaError(f"[replicate.litestream] {name} must be {kind}, got {value!r}")
        return where, name, value
    known = sorted({*_REPLICA_OPTIONS, *_DB_OPTIONS, *_TOP_OPTIONS})
    raise ReplicaError(f"[replicate.litestream] unknown option {name!r} (memoryd passes on: {', '.join(known)})")


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ReplicaError(f"[replicate] url must be a replica URL (file://, s3://, sftp://), got {value!r}")
    parts = urlsplit(value)
    if parts.scheme not in SCHEMES:
        raise ReplicaError(f"[replicate] url must start with file://, s3:// or sftp://, got {shown(value)!r}")
    if parts.password is not None:
        raise ReplicaError(f"[replicate] url holds a password: remove it and set {SFTP_PASSWORD} "
                           "in the credentials_file or the environment")
    if parts.query or parts.fragment:
        raise ReplicaError("[replicate] url takes no query: set endpoint, region and [replicate.litestream] "
                           "options instead")
    if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/")):
        raise ReplicaError(f"[replicate] a file:// url names an absolute local path (file:///…), got {value!r}")
    if parts.scheme in ("s3", "sftp") and not parts.hostname:
        raise ReplicaError(f"[replicate] a {parts.scheme}:// url names a "
                           f"{'bucket' if parts.scheme == 's3' else 'host'}, got {shown(value)!r}")
    if parts.scheme == "sftp" and not parts.username:
        raise ReplicaError("[replicate] an sftp:// url names its user: sftp://user@host/path")
    return value


def parse(raw: Any) -> Replica:
    """The checked ``[replicate]`` table."""
    if not isinstance(raw, dict):
        raise ReplicaError("[replicate] must be a table")
    if "url" not in raw:
        raise ReplicaError("[replicate] needs url = \"file:///…\", \"s3://bucket/path\" or \"sftp://user@host/path\"")
    kw: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "url":
            kw["url"] = _url(value)
        elif key in ("endpoint", "region"):
            if not isinstance(value, str) or not value or any(c in value for c in "\n\r"):
                raise ReplicaError(f"[replicate] {key} must be a non-empty one-line string, got {value!r}")
            if key == "endpoint" and urlsplit(value).password is not None:
                raise ReplicaError("[replicate] endpoint holds a password: put credentials in the credentials_file")
            kw[key] = value
        elif key == "credentials_file":
            if not isinstance(value, str) or not Path(value).expanduser().is_absolute():
                raise ReplicaError(f"[replicate] credentials_file must be an absolute path, got {value!r}")
            kw[key] = Path(value).expanduser()
            kw["credentials"] = read_credentials(kw[key])
        elif key in _SECONDS:
            kw[key] = _seconds(key, value)
        elif key == "litestream":
            if not isinstance(value, dict):
                raise ReplicaError("[replicate.litestream] must be a table of Litestream's own options")
            kw["options"] = tuple(_option(name, v) for name, v in value.items())
        else:
            raise ReplicaError(f"[replicate] unknown key {key!r}")
    replica = Replica(**kw)
    if replica.restart_min_s > replica.restart_max_s:
        raise ReplicaError("[replicate] restart_min_s must not exceed restart_max_s")
    if replica.scheme != "s3" and (replica.endpoint or replica.region):
        raise ReplicaError("[replicate] endpoint and region apply to an s3:// url only")
    return replica
