"""``memoryd systemd-units``: the two systemd user units for *this* installed memoryd.

They are generated, not shipped: ``ExecStart=`` must name the ``memoryd`` of the
environment it was installed into, and the sandbox must leave exactly the store directory
(and each other directory the daemon writes a file of the store's in: the default store's
heads file is under ``$XDG_STATE_HOME``) and ``%t/memoryd`` writable, which depends on the
user's config. ``memoryd.socket`` listens
where memoryctl looks first; ``memoryd.service`` inherits that listener and reports
``READY=1`` once the store is open. Hardening a user manager cannot apply (``User=``,
``ProtectControlGroups=``, ``ProtectProc=``, ``IPAddressDeny=``) is left out rather than
pretended.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from memoryd_protocol import DISTRIBUTION

from .errors import DaemonError

SOCKET_UNIT = "memoryd.socket"
SERVICE_UNIT = "memoryd.service"
#: Where ``systemd --user`` looks for a user's own units (systemd.unit(5), "User Unit Search Path").
USER_UNIT_DIR_HINT = "~/.config/systemd/user"
NEXT_STEP = "systemctl --user daemon-reload && systemctl --user enable --now memoryd.socket"


class UnitError(DaemonError, ValueError):
    """A path that cannot be written into a unit file."""


class Install:
    """What the units depend on; everything else in them is fixed. (A plain class:
    ``memoryd mcp``'s start imports this module, and a dataclass (inspect) or a NamedTuple
    (whose string annotations typing compiles, paths.OwnerRecord says why) costs it.)"""

    def __init__(self, exec_start: Sequence[str], documentation: Sequence[str], store_dir: Path, mkdir: str,
                 private_tmp: bool = True, also_writable: Sequence[Path] = ()) -> None:
        self.exec_start = exec_start  # argv without "serve"
        self.documentation = documentation  # URIs
        self.store_dir = store_dir
        self.mkdir = mkdir  # absolute path of mkdir(1), for ExecStartPre
        self.private_tmp = private_tmp  # False when memoryd or its store is in a temporary directory
        self.also_writable = also_writable  # other directories the daemon writes the store's files in


# --- discovering this install --------------------------------------------------------------


def memoryd_command(executable: str | None = None) -> tuple[str, ...]:
    """The installed script next to the interpreter, else ``python -m memoryd``. The path is
    absolute but not resolved: only a venv's unresolved ``bin/python`` finds its site-packages."""
    python = Path(os.path.abspath(executable or sys.executable))
    script = python.parent / "memoryd"
    if script.is_file() and os.access(script, os.X_OK):
        return (str(script),)
    return (str(python), "-m", "memoryd")


def documentation(package_root: Path | None = None) -> tuple[str, ...]:
    """``Documentation=`` URIs for this install: a source checkout's README, else the
    installed distribution's ``METADATA`` (whose body is the README, of this very version),
    plus any ``Project-URL`` the metadata carries."""
    if package_root is None:
        package_root = Path(__file__).resolve().parents[2]
    readme = package_root / "README.md"
    if readme.is_file() and (package_root / "pyproject.toml").is_file():
        return (readme.as_uri(),)
    from importlib import metadata

    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return ()
    uris: list[str] = []
    for file in dist.files or ():
        if file.name == "METADATA" and file.parent.name.endswith(".dist-info"):
            path = Path(str(dist.locate_file(file))).absolute()
            if path.is_file():
                uris.append(path.as_uri())
                break
    for entry in dist.metadata.get_all("Project-URL") or []:
        url = entry.partition(",")[2].strip()
        if url.startswith(("https://", "http://")):
            uris.append(url)
    return tuple(uris)


def store_path() -> Path:
    """The store ``memoryd serve`` opens: ``db_path`` from the default config file when it
    sets one, else the per-user data dir's (platformdirs)."""
    from memoryd_protocol.paths import default_config_path, default_db_path

    config_path = default_config_path()
    if config_path.exists():
        from . import config

        return config.load(config_path).db_path
    return default_db_path()


def written_dirs(db: Path) -> tuple[Path, ...]:
    """The directory of every file the daemon writes for the store ``db``
    (memoryd_protocol.paths.store_files), the store's first."""
    from memoryd_protocol.paths import store_files

    return tuple(dict.fromkeys([db.parent, *(f.parent for f in store_files(db))]))


TEMPORARY_DIRS = (Path("/tmp"), Path("/var/tmp"))


def in_temporary_dir(path: Path) -> bool:
    """Under /tmp or /var/tmp, which PrivateTmp= replaces with empty directories."""
    return any(path == tmp or tmp in path.parents for tmp in TEMPORARY_DIRS)


def detect() -> Install:
    import shutil

    command = memoryd_command()
    store, *others = written_dirs(store_path())
    mkdir = shutil.which("mkdir") or "/bin/mkdir"
    private_tmp = not any(in_temporary_dir(p) for p in (Path(command[0]), store, *others))
    return Install(command, documentation(), store, mkdir, private_tmp, others)


# --- rendering (pure) ----------------------------------------------------------------------


def _literal(value: str) -> str:
    """Refuse what would break a unit file's line structure."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise UnitError(f"a control character cannot go into a unit file: {value!r}")
    return value


def _escape(value: str) -> str:
    """A literal for a unit file value: no specifier (``%``) expansion."""
    return _literal(value).replace("%", "%%")


def quote(arg: str, *, command: bool = True) -> str:
    """One word of a command line (``ExecStart=``) or of a path list (``ReadWritePaths=``),
    literal: no specifier expansion, no variable expansion in a command (paths have none),
    quoted when it must be."""
    value = _escape(arg)
    if command:
        value = value.replace("$", "$$")
    if value and not any(c in value for c in ' \t"\'\\;'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _command(argv: Sequence[str]) -> str:
    return " ".join(quote(a) for a in argv)


def _header(install: Install) -> list[str]:
    from . import __version__

    return [f"# Generated by `memoryd systemd-units` (memoryd {__version__}) for the memoryd at",
            f"#   {_literal(' '.join(install.exec_start))}",
            "# Regenerate it after reinstalling memoryd elsewhere or changing db_path."]


def _documentation(install: Install) -> list[str]:
    return [f"Documentation={_escape(uri)}" for uri in install.documentation]


def _text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def render_socket(install: Install) -> str:
    return _text([
        *_header(install),
        "[Unit]",
        "Description=memoryd socket (dsh-memory-protocol v1)",
        *_documentation(install),
        "",
        "[Socket]",
        "# The path memoryctl and the clients try first ($XDG_RUNTIME_DIR/memoryd/memoryd.sock).",
        "ListenStream=%t/memoryd/memoryd.sock",
        "SocketMode=0600",
        "DirectoryMode=0700",
        "Accept=no",
        "",
        "[Install]",
        "WantedBy=sockets.target",
    ])


def render_service(install: Install) -> str:
    store = str(install.store_dir)
    writable = [store, *map(str, install.also_writable)]
    private_tmp = (["PrivateTmp=yes"] if install.private_tmp else
                   ["# No PrivateTmp=: memoryd or its store is under /tmp or /var/tmp, which it would hide."])
    return _text([
        *_header(install),
        "[Unit]",
        "Description=memoryd: local, approval-gated agent memory",
        *_documentation(install),
        "Requires=memoryd.socket",
        "After=memoryd.socket",
        "",
        "[Service]",
        "# READY=1 once the store is open; the listening socket is inherited from memoryd.socket.",
        "Type=notify",
        "NotifyAccess=main",
        "# '+': outside the sandbox, where their parent directories are writable (a directory",
        "# must exist before ReadWritePaths= can make it writable).",
        f"ExecStartPre=+{_command([install.mkdir, '-p', '-m', '0700', *writable])}",
        f"ExecStart={_command([*install.exec_start, 'serve'])}",
        "Restart=on-failure",
        "# SIGTERM: stop accepting, deny pending approvals (audited), finish queued commits.",
        "TimeoutStopSec=30",
        "UMask=0077",
        "",
        "# Sandbox. A user manager can set up namespaces only inside a user namespace of the",
        "# service's own, hence PrivateUsers= (systemd 252 does not imply it).",
        "PrivateUsers=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "# Writable: the directories of the store's files (db, -wal, -shm, owner record, ledger",
        "# heads) and the socket's; nothing else.",
        f"ReadWritePaths={' '.join(quote(d, command=False) for d in writable)} %t/memoryd",
        *private_tmp,
        "PrivateDevices=yes",
        "PrivateIPC=yes",
        "PrivateMounts=yes",
        "# Only AF_UNIX. The inherited listener and the notify and journal sockets live in the",
        "# file system, which a private network namespace does not hide.",
        "PrivateNetwork=yes",
        "RestrictAddressFamilies=AF_UNIX",
        "ProtectHostname=yes",
        "ProtectClock=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "# CPython (no JIT) and memoryd's extension modules never map writable+executable memory.",
        "MemoryDenyWriteExecute=yes",
        "KeyringMode=private",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallFilter=~@privileged @resources",
        "SystemCallErrorNumber=EPERM",
        "",
        "[Install]",
        "# Enable the socket; the service starts on the first connection.",
        "Also=memoryd.socket",
    ])


def render(install: Install) -> dict[str, str]:
    """File name → contents."""
    return {SOCKET_UNIT: render_socket(install), SERVICE_UNIT: render_service(install)}


# --- command line --------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``systemd-units`` to memoryd's subcommands; dispatch it to :func:`run`."""
    parser = subparsers.add_parser(
        "systemd-units", help="print or write the systemd user units",
        description="Print the systemd user units (memoryd.socket, memoryd.service) for this memoryd, or write "
        "them with --output-dir. ExecStart= names this install's memoryd; the service is sandboxed with only the "
        "store and socket directories writable.")
    parser.add_argument("--output-dir", type=Path, metavar="DIR",
                        help=f"write {SOCKET_UNIT} and {SERVICE_UNIT} into DIR (usually {USER_UNIT_DIR_HINT}) "
                             "instead of printing them")


def _is_user_unit_dir(path: Path) -> bool:
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return path.absolute() == (config_home / "systemd" / "user").absolute()


def run(args: argparse.Namespace) -> int:
    from .config import ConfigError

    try:
        units = render(detect())
    except (ConfigError, UnitError) as exc:
        print(f"memoryd: {exc}", file=sys.stderr)
        return 2
    output_dir: Path | None = args.output_dir
    if output_dir is None:
        for name, text in units.items():
            print(f"# ---- {name} (save as {USER_UNIT_DIR_HINT}/{name}) ----")
            sys.stdout.write(text)
            print()
        print(f"memoryd: to install them: memoryd systemd-units --output-dir {USER_UNIT_DIR_HINT} && {NEXT_STEP}",
              file=sys.stderr)
        return 0
    output_dir = output_dir.expanduser()
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        for name, text in units.items():
            tmp = output_dir / f".{name}.tmp"
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(output_dir / name)
    except OSError as exc:
        print(f"memoryd: cannot write the units to {output_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 3
    for name in units:
        print(f"wrote {output_dir / name}")
    if not _is_user_unit_dir(output_dir):
        print(f"note: systemd --user does not read {output_dir}; {USER_UNIT_DIR_HINT} is the usual place "
              "(systemd.unit(5), User Unit Search Path)")
    print(f"next: {NEXT_STEP}")
    return 0
