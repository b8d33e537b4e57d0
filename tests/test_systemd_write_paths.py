"""The generated memoryd.service leaves writable every file the daemon writes, and nothing
else: the list is paths.store_files and paths.runtime_files (the one place that says where
the daemon writes), and a daemon started as the unit starts it, in a mount namespace where
everything but ReadWritePaths= is read-only (ProtectHome=read-only, ProtectSystem=strict),
writes all of them and complains of none."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from e2e_helpers import add
from memoryd import units
from memoryd_protocol import paths
from rawclient import socket_client

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
UNSHARE = shutil.which("unshare")


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A home of the test's own (short: the runtime dir holds a socket), its XDG dirs in it."""
    base = Path(tempfile.mkdtemp(prefix="md-sb-", dir="/tmp"))
    monkeypatch.setenv("HOME", str(base / "home"))
    for var, sub in (("XDG_CONFIG_HOME", "home/.config"), ("XDG_DATA_HOME", "home/.local/share"),
                     ("XDG_STATE_HOME", "home/.local/state"), ("XDG_RUNTIME_DIR", "run")):
        (base / sub).mkdir(parents=True, mode=0o700)
        monkeypatch.setenv(var, str(base / sub))
    monkeypatch.delenv("MEMORYD_SOCKET", raising=False)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def service_of(install: units.Install) -> dict[str, list[str]]:
    service: dict[str, list[str]] = {}
    for line in units.render_service(install).splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            service.setdefault(key, []).append(value)
    return service


def writable(service: dict[str, list[str]]) -> list[Path]:
    """ReadWritePaths=, with %t as a user manager expands it."""
    runtime = os.environ["XDG_RUNTIME_DIR"]
    return [Path(word.replace("%t", runtime)) for value in service["ReadWritePaths"] for word in shlex.split(value)]


def created_first(service: dict[str, list[str]]) -> list[Path]:
    """The directories ExecStartPre= makes (outside the sandbox) before ReadWritePaths= needs them."""
    (pre,) = service["ExecStartPre"]
    argv = shlex.split(pre.removeprefix("+"))
    assert argv[1:4] == ["-p", "-m", "0700"]
    return [Path(a) for a in argv[4:]]


def covered(path: Path, dirs: list[Path]) -> bool:
    return any(path == d or d in path.parents for d in dirs)


def every_written_file(db: Path) -> tuple[Path, ...]:
    sock = Path(os.environ["XDG_RUNTIME_DIR"]) / "memoryd" / "memoryd.sock"
    return (*paths.store_files(db), *paths.runtime_files(sock))


def configure(root: Path, text: str) -> None:
    config = root / "home" / ".config" / "memoryd" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)


@pytest.mark.parametrize("where", ["default", "db_path"])
def test_every_file_the_daemon_writes_is_under_read_write_paths(root: Path, where: str) -> None:
    if where == "db_path":
        configure(root, f'db_path = "{root / "elsewhere" / "m.db"}"\n')
    db = paths.default_db_path() if where == "default" else root / "elsewhere" / "m.db"
    service = service_of(units.detect())
    assert service["ProtectHome"] == ["read-only"] and service["ProtectSystem"] == ["strict"]
    dirs = writable(service)
    files = every_written_file(db)
    assert paths.heads_path_for(db) in files
    assert [f for f in files if not covered(f, dirs)] == []
    # each writable directory but the socket's (the socket unit makes that) exists before the sandbox
    assert created_first(service) == [d for d in dirs if d != Path(os.environ["XDG_RUNTIME_DIR"]) / "memoryd"]
    if SYSTEMD_ANALYZE is None:
        pytest.fail("systemd-analyze is not installed (Debian package systemd)")
    out = root / "units"
    out.mkdir()
    for name, text in units.render(units.detect()).items():
        (out / name).write_text(text)
    r = subprocess.run([SYSTEMD_ANALYZE, "verify", "--user", str(out / units.SOCKET_UNIT),
                        str(out / units.SERVICE_UNIT)], capture_output=True, text=True, timeout=120, cwd=root,
                       env=dict(os.environ, SYSTEMD_PAGER="", SYSTEMD_COLORS="0"))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


#: the mounts ProtectHome=read-only and ReadWritePaths= make, as far as the test's home goes:
#: all of it read-only, then each writable directory bound read-write again on top
SANDBOX = """set -e
mount --bind "$MD_ROOT" "$MD_ROOT"
mount -o remount,bind,ro "$MD_ROOT"
for d in $MD_WRITABLE; do mount --bind "$d" "$d"; mount -o remount,bind,rw "$d"; done
shift
LISTEN_PID=$$ exec "$@"
"""


async def two_writes(sock: Path) -> None:
    async with socket_client(sock) as raw:
        await add(raw, "Prefers tabs")
        await add(raw, "Uses uv")


def test_the_daemon_sandboxed_as_the_unit_says_writes_every_file_it_needs(root: Path) -> None:
    if UNSHARE is None:
        pytest.fail("unshare is not installed (Debian package util-linux)")
    configure(root, 'write_policy = "auto"\nheads_every_rows = 1\n')
    db = paths.default_db_path()
    service = service_of(units.detect())
    dirs = writable(service)
    for d in created_first(service):  # ExecStartPre=+, outside the sandbox
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock = Path(os.environ["XDG_RUNTIME_DIR"]) / "memoryd" / "memoryd.sock"
    sock.parent.mkdir(mode=0o700)  # the socket unit's DirectoryMode=0700
    before = {p for p in root.rglob("*") if not p.is_dir()}

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(8)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(root / "notify"))
    notify.settimeout(30)
    fd = listener.fileno()

    def as_fd3() -> None:
        os.dup2(fd, 3)

    (exec_start,) = service["ExecStart"]
    env = dict(os.environ, LISTEN_FDS="1", NOTIFY_SOCKET=str(root / "notify"), MD_ROOT=str(root),
               MD_WRITABLE=" ".join(shlex.quote(str(d)) for d in dirs))
    proc = subprocess.Popen([UNSHARE, "--user", "--map-root-user", "--mount", "sh", "-c", SANDBOX, "sh", "--",
                             *shlex.split(exec_start)], env=env, preexec_fn=as_fd3, close_fds=False,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert notify.recv(64) == b"READY=1"
        anyio.run(two_writes, sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        listener.close()
        notify.close()
    log = err.decode(errors="replace")
    assert proc.returncode == 0, log
    assert "Read-only file system" not in log and "WARNING" not in log and "ERROR" not in log, log
    heads = paths.heads_path_for(db)
    assert heads is not None
    events = [line.split('"event":"')[1].split('"')[0] for line in heads.read_text().splitlines()]
    assert events == ["start", "every", "every", "stop"]
    # everything it wrote is a file paths.py names, in a directory the unit leaves writable
    written = {p for p in root.rglob("*") if not p.is_dir()} - before - {root / "notify"}
    assert written <= set(every_written_file(db)), sorted(written - set(every_written_file(db)))
    assert all(covered(p, dirs) for p in written)
    assert heads in written
