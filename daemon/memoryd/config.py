"""Configuration: TOML file + command-line overrides, validated once at start.

Unknown keys and bad values are refused with a message naming the key, so a typo never
silently falls back to a default (a default write policy of ``auto`` would be a security
bug, not a convenience).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryd_protocol.constants import (
    DEFAULT_APPROVAL_TIMEOUT_S,
    DEFAULT_BUDGETS,
    DEFAULT_BUSY_TIMEOUT_MS,
    DEFAULT_HALF_LINE_TIMEOUT_S,
    DEFAULT_MAX_BATCH_CALLS,
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_PENDING_APPROVALS,
    DEFAULT_MAX_SESSIONS_PER_CONNECTION,
    GRID,
    PROPOSAL_MAX_PENDING,
    PROPOSAL_MAX_TEXT,
    QUERY_DEFAULT_LIMIT,
    QUERY_HARD_CAP,
    SCOPES,
    TRACKS,
    WRITE_POLICIES,
)
from memoryd_protocol.paths import default_config_path, default_db_path, default_socket_path

from .errors import DaemonError

if TYPE_CHECKING:
    from .replica import Replica

#: For --help, which must not compute the real path (that costs the relay a platformdirs import).
DEFAULT_CONFIG_HINT = "$XDG_CONFIG_HOME/memoryd/config.toml"


#: ``approvers``: who may subscribe as an approver (``approval/subscribe``): a process with a
#: controlling terminal, anyone, or a connection that proved the approver key (which is then
#: needed to answer a connection's own prompt too).
APPROVERS = ("interactive", "any", "keyed")
#: ``mcp_approvals``: how a ``memoryd mcp`` session's writes are asked: of the human through
#: the MCP host's elicitation dialog, or always of subscribed approvers (``memoryctl approve``).
MCP_APPROVALS = ("elicitation", "approvers")


class ConfigError(DaemonError, ValueError):
    """A configuration file or option that memoryd refuses to start with."""

    exit_code = 2


_POLICY_RANK = {"auto": 0, "ask": 1, "off": 2}


class Config:
    """Every setting, at its default until the file or a command-line option changes it. A
    plain class: ``dataclasses`` imports ``inspect``, too dear for the relay, which loads it too."""

    def __init__(self) -> None:
        self.db_path: Path = default_db_path()
        self._socket_path: Path | None = None
        self.write_policy: str = "ask"
        self.approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S
        self.language: str = "en"
        self.max_entries_per_query: int = QUERY_DEFAULT_LIMIT
        self.max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
        self.budgets: dict[tuple[str, str], int] = dict(DEFAULT_BUDGETS)
        self.write_policies: dict[str, str] = {}
        self.proposal_max_text: int = PROPOSAL_MAX_TEXT
        self.proposal_max_pending: int = PROPOSAL_MAX_PENDING
        #: how long a write waits for another process's write lock before STORE_UNAVAILABLE busy
        self.busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
        #: who may subscribe as an approver: "interactive" (a process with a controlling
        #: terminal), "any", or "keyed" (proved $XDG_CONFIG_HOME/memoryd/approver.key)
        self.approvers: str = "interactive"
        self.mcp_approvals: str = "elicitation"
        # Resource caps: what one client can make the daemon hold.
        self.max_connections: int = DEFAULT_MAX_CONNECTIONS
        self.max_batch_calls: int = DEFAULT_MAX_BATCH_CALLS
        self.max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
        self.half_line_timeout_s: float = DEFAULT_HALF_LINE_TIMEOUT_S
        self.max_pending_approvals: int = DEFAULT_MAX_PENDING_APPROVALS
        self.max_sessions_per_connection: int = DEFAULT_MAX_SESSIONS_PER_CONNECTION
        #: unsent output over all connections together before the longest behind are dropped:
        #: beside the largest reply (never counted), room for two more of the largest kind (an
        #: audit/list of a thousand snapshot rows), well within a small machine's memory
        self.max_unsent_bytes_total: int = 32 * 1024 * 1024
        #: requests in flight over all connections together: past it, connections stop reading.
        #: An MCP call in flight holds the SDK's tasks and objects besides the daemon's, so this
        #: many stay a small part of its memory, and are still four connections' full pipelines
        #: (connection.MAX_INFLIGHT each).
        self.max_inflight_total: int = 1024
        #: frozen snapshots the store may hold: a new session's first snapshot beyond is refused;
        #: a year and more of a few hundred sessions a day (each a small row naming its text by digest)
        self.max_snapshots: int = 100_000
        #: UTF-8 bytes of the distinct snapshot texts the store may hold: a new text beyond is
        #: refused; each text is kept once, so thousands of 20 kB snapshots
        self.max_snapshot_bytes: int = 64 * 1024 * 1024
        #: new sessions' first snapshots one connection may take while it lives: a harness's relay,
        #: an MCP host's spawn and memoryctl each hold one session; a client that multiplexes has room
        self.max_new_snapshots_per_connection: int = 64
        #: new sessions' first snapshots one peer process may take in any 60 seconds: a process
        #: starting sessions faster than two a second is a loop, not a person
        self.max_new_snapshots_per_minute: int = 120
        #: pending proposals of all sessions together (proposal_max_pending is per session): far
        #: above that, a bound on the table, not a share everyone competes for
        self.proposal_max_pending_total: int = 1024
        #: how often the ledger's head is witnessed in the heads file while writes go on
        self.heads_every_rows: int = 1000
        self.heads_every_s: float = 600.0
        #: ``[workspace_aliases]``: each path's canonical path
        self.workspace_aliases: Mapping[str, str] = {}
        #: the config file set ``db_path`` (the stdio relay then insists the daemon serves it)
        self.db_path_configured = False
        #: the config file set ``socket_path`` (a relay then never looks for another socket)
        self.socket_configured = False
        #: The file ``load()`` read (absolute), None without one; ``daemon/status`` reports it.
        self.config_path: Path | None = None
        #: ``[replicate]``: the replica Litestream ships the store to (None: no replication)
        self.replicate: Replica | None = None

    @property
    def socket_path(self) -> Path:
        """The per-user default until the file or ``--socket`` sets one, computed when first
        read (it may import tempfile, which a relay given ``--socket`` never needs)."""
        if self._socket_path is None:
            self._socket_path = default_socket_path()
        return self._socket_path

    @socket_path.setter
    def socket_path(self, value: Path) -> None:
        self._socket_path = value

    def policy_for(self, layers: Iterable[tuple[str, str]], sources: Iterable[str]) -> str:
        """The effective write policy of one write, the only place it is computed: the
        strictest of each layer's (its ``track/scope`` override, else ``write_policy``, so an
        override may loosen the default) and of every touched source's ``source:<name>``
        override, which can only make it stricter: a client picks its own source label, so
        a label must never open what the layer's policy closes."""
        policies = [self.write_policies.get(f"{track}/{scope}", self.write_policy) for track, scope in layers]
        if not policies:
            raise ValueError("a write lands in at least one layer")
        for source in sources:
            override = self.write_policies.get(f"source:{source}")
            if override is not None:
                policies.append(override)
        return max(policies, key=_POLICY_RANK.__getitem__)


def _int(key: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"config: {key} must be an integer from {lo} to {hi}, got {value!r}")
    return value


def _policy(key: str, value: Any) -> str:
    if value not in WRITE_POLICIES:
        raise ConfigError(f"config: {key} must be one of {', '.join(WRITE_POLICIES)}, got {value!r}")
    return str(value)


def _path(key: str, value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"config: {key} must be a non-empty path string, got {value!r}")
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise ConfigError(f"config: {key} must be an absolute path, got {value!r}")
    return path


def default_config_file() -> Path | None:
    """The default config file, when it exists."""
    path = default_config_path()
    return path if path.exists() else None


def load(path: Path | None) -> Config:
    cfg = Config()
    if path is None:
        return cfg
    import tomllib  # only with a config file: keeps the relay's start-up lean

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config: cannot read {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    apply(cfg, raw)
    cfg.config_path = path.absolute()
    return cfg


#: the integer keys, and their bounds
_INTS: dict[str, tuple[int, int]] = {
    "max_entries_per_query": (1, QUERY_HARD_CAP),
    "max_message_bytes": (1024, 256 * 1024 * 1024),
    "proposal_max_text": (1, 100_000),
    "proposal_max_pending": (1, 1000),
    "busy_timeout_ms": (0, 600_000),
    "max_connections": (1, 65536),
    "max_batch_calls": (1, 10_000),
    "max_buffered_bytes": (65536, 1024 * 1024 * 1024),
    "max_pending_approvals": (1, 10_000),
    "max_sessions_per_connection": (1, 1_000_000),
    "max_unsent_bytes_total": (1024 * 1024, 64 * 1024 * 1024 * 1024),
    "max_inflight_total": (1, 1_000_000),
    "max_snapshots": (1, 1_000_000_000),
    "max_snapshot_bytes": (1, 1024 * 1024 * 1024 * 1024),
    "max_new_snapshots_per_connection": (1, 1_000_000_000),
    "max_new_snapshots_per_minute": (1, 1_000_000_000),
    "proposal_max_pending_total": (1, 1_000_000),
    "heads_every_rows": (1, 1_000_000_000),
}
_SECONDS = ("approval_timeout_s", "half_line_timeout_s", "heads_every_s")
_CHOICES: dict[str, tuple[str, ...]] = {"language": ("en", "zh"), "approvers": APPROVERS, "mcp_approvals": MCP_APPROVALS}


def apply(cfg: Config, raw: dict[str, Any]) -> None:
    for key, value in raw.items():
        if key in _INTS:
            setattr(cfg, key, _int(key, value, *_INTS[key]))
        elif key in _SECONDS:
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86400:
                raise ConfigError(f"config: {key} must be a number of seconds in (0, 86400], got {value!r}")
            setattr(cfg, key, float(value))
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                raise ConfigError(f"config: {key} must be {' or '.join(_CHOICES[key])}, got {value!r}")
            setattr(cfg, key, value)
        elif key == "db_path":
            cfg.db_path = _path(key, value)
            cfg.db_path_configured = True
        elif key == "socket_path":
            cfg.socket_path = _path(key, value)
            cfg.socket_configured = True
        elif key == "write_policy":
            cfg.write_policy = _policy(key, value)
        elif key == "budgets":
            _budgets(cfg, value)
        elif key == "write_policies":
            _write_policies(cfg, value)
        elif key == "replicate":
            from . import replica  # only with the section: its checks cost the relay nothing

            try:
                cfg.replicate = replica.parse(value)
            except replica.ReplicaError as exc:
                raise ConfigError(f"config: {exc}") from None
        elif key == "workspace_aliases":
            from memoryd_protocol import workspaces  # only with the table: the relay never loads it

            try:
                cfg.workspace_aliases = workspaces.parse_aliases(value)
            except workspaces.AliasTableError as exc:
                raise ConfigError(f"config: {exc}") from None
        else:
            raise ConfigError(f"config: unknown key {key!r}")


def _budgets(cfg: Config, value: Any) -> None:
    if not isinstance(value, dict):
        raise ConfigError("config: [budgets] must be a table")
    for track, scopes in value.items():
        if track not in TRACKS:
            raise ConfigError(f"config: unknown budget track {track!r} (expected user or agent)")
        if not isinstance(scopes, dict):
            raise ConfigError(f"config: [budgets.{track}] must be a table")
        for scope_key, limit in scopes.items():
            scope = scope_key.replace("_", "-")
            if scope not in SCOPES:
                raise ConfigError(f"config: unknown budget scope {scope_key!r} in [budgets.{track}]")
            cfg.budgets[(track, scope)] = _int(f"budgets.{track}.{scope_key}", limit, 1, 10_000_000)


def _write_policies(cfg: Config, value: Any) -> None:
    if not isinstance(value, dict):
        raise ConfigError("config: [write_policies] must be a table")
    cells = {f"{t}/{s}" for t, s in GRID}
    for key, policy in value.items():
        if not (key in cells or (key.startswith("source:") and len(key) > len("source:"))):
            raise ConfigError(f"config: write_policies key {key!r} must be track/scope or source:<name>")
        cfg.write_policies[key] = _policy(f"write_policies.{key}", policy)
