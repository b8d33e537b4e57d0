"""``memoryd systemd-units`` (memoryd/units.py): the generated user units name this install's
memoryd, pass ``systemd-analyze verify``, rate ≤ 4.0 with ``systemd-analyze security`` (and
exactly what the README quotes), and their ExecStart really serves an inherited socket the
way systemd hands it over."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path
from urllib.parse import unquote, urlparse

import platformdirs
import pytest
from memoryd import cli, units

ROOT = Path(__file__).resolve().parents[1]
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
#: a test that needs systemd-analyze fails without it: a skipped check proves nothing
needs_systemd_analyze = pytest.mark.usefixtures("systemd_analyze_installed")
EXPOSURE = re.compile(r"Overall exposure level for memoryd\.service: (\d+\.\d+) ")
#: what the README's "Running under systemd" says systemd-analyze security measures
README_EXPOSURE = re.compile(r"rates the service \*\*(\d+\.\d+) OK\*\* \(systemd (\d+)\), or (\d+\.\d+) when "
                             r"memoryd or its store is under `/tmp` or `/var/tmp`")


@pytest.fixture
def systemd_analyze_installed() -> None:
    if SYSTEMD_ANALYZE is None:
        pytest.fail("systemd-analyze is not installed (Debian package systemd; the test run installs it when run as root)")


@pytest.fixture(autouse=True)
def hermetic_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test may read the user's real config or name their real store."""
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        path = tmp_path / "xdg" / var.lower()
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(path))
    # Short: systemd-analyze verify --user loads every installed user unit, and a socket
    # under %t (gpg-agent's, say) must fit a Unix socket path (108 bytes), which pytest's
    # tmp_path under a busy /tmp/pytest-of-root/pytest-NNN/<test name> may not.
    runtime = Path(tempfile.mkdtemp(prefix="md-rt-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("MEMORYD_SOCKET", raising=False)
    yield
    shutil.rmtree(runtime, ignore_errors=True)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as systemd reads it: sections of keys, each key with all its values in order."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for line in text.splitlines():
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"a setting outside any section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep and key == key.strip() and key.isidentifier(), f"not a setting: {line!r}"
        current.setdefault(key, []).append(value)
    return sections


def install_at(base: Path, *, name: str = "memoryd") -> units.Install:
    """An install whose memoryd exists (systemd-analyze verify checks the ExecStart binary)."""
    script = base / "bin" / name
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    return units.Install((str(script),), ("file:///usr/share/doc/memoryd/README.md",), base / "store", "/bin/mkdir")


def write_units(install: units.Install, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in units.render(install).items():
        (directory / name).write_text(text)
    return directory / units.SOCKET_UNIT, directory / units.SERVICE_UNIT


def analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """systemd-analyze for user units without a running user manager: it needs only
    $XDG_RUNTIME_DIR (the hermetic one) to resolve %t."""
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run([SYSTEMD_ANALYZE, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, SYSTEMD_PAGER="", SYSTEMD_COLORS="0"))


# --- discovering the install -----------------------------------------------------------------


def test_exec_start_is_the_console_script_next_to_the_interpreter(tmp_path: Path) -> None:
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    python = bindir / "python"
    python.symlink_to(sys.executable)  # a venv's python is a symlink: it must not be resolved
    script = bindir / "memoryd"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert units.memoryd_command(str(python)) == (str(script),)


def test_exec_start_falls_back_to_the_interpreter_without_a_console_script(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python3"
    assert units.memoryd_command(str(python)) == (str(python), "-m", "memoryd")
    # a non-executable file of that name is not a console script
    (tmp_path / "bin" / "memoryd").write_text("")
    assert units.memoryd_command(str(python)) == (str(python), "-m", "memoryd")


def test_exec_start_for_this_test_run_is_the_installed_memoryd() -> None:
    assert units.memoryd_command() == (str(Path(os.path.abspath(sys.executable)).parent / "memoryd"),)


def test_documentation_is_the_readme_of_a_source_checkout() -> None:
    assert units.documentation() == ((ROOT / "README.md").as_uri(),)
    assert units.documentation(ROOT) == ((ROOT / "README.md").as_uri(),)


def test_documentation_of_a_wheel_install_is_its_metadata_which_carries_the_readme(tmp_path: Path) -> None:
    (uri,) = units.documentation(tmp_path)  # no README.md beside the package: as installed from a wheel
    assert uri.startswith("file:///") and uri.endswith(".dist-info/METADATA")
    metadata = Path(unquote(urlparse(uri).path))
    message = Parser().parsestr(metadata.read_text(encoding="utf-8"))
    assert message["Name"] == "dsh-memoryd"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.splitlines()[0] in message.get_payload()


def test_store_dir_is_the_per_user_data_dir() -> None:
    assert units.store_path().parent == Path(platformdirs.user_data_dir("memoryd"))
    assert units.store_path().parent == Path(os.environ["XDG_DATA_HOME"]) / "memoryd"


def test_store_dir_follows_db_path_in_the_config(tmp_path: Path) -> None:
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "memoryd" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'db_path = "{tmp_path / "elsewhere" / "m.db"}"\n')
    assert units.store_path().parent == tmp_path / "elsewhere"


def test_a_bad_config_is_a_one_line_error_and_writes_nothing(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "memoryd" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('db_path = "relative/m.db"\n')
    out_dir = tmp_path / "units"
    assert cli.main(["systemd-units", "--output-dir", str(out_dir)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "memoryd: config: db_path must be an absolute path, got 'relative/m.db'\n"
    assert not out_dir.exists()


@pytest.mark.parametrize(("path", "temporary"), [
    ("/tmp", True), ("/tmp/a/memoryd", True), ("/var/tmp/x", True),
    ("/tmpfoo/memoryd", False), ("/home/u/.local/bin/memoryd", False), ("/var/lib/tmp", False),
])
def test_private_tmp_is_dropped_only_for_paths_it_would_hide(path: str, temporary: bool) -> None:
    assert units.in_temporary_dir(Path(path)) is temporary


def test_detect_keeps_private_tmp_unless_the_store_or_install_is_temporary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "/home/someone/.local/share")
    monkeypatch.setenv("XDG_STATE_HOME", "/home/someone/.local/state")
    monkeypatch.setattr(units, "memoryd_command", lambda: ("/home/someone/.local/bin/memoryd",))
    assert units.detect().private_tmp is True
    monkeypatch.setenv("XDG_DATA_HOME", "/tmp/xdg-data")
    assert units.detect().private_tmp is False
    # the default store's heads file, under /tmp, would be hidden just the same
    monkeypatch.setenv("XDG_DATA_HOME", "/home/someone/.local/share")
    monkeypatch.setenv("XDG_STATE_HOME", "/tmp/xdg-state")
    assert units.detect().private_tmp is False
    monkeypatch.setenv("XDG_STATE_HOME", "/home/someone/.local/state")
    monkeypatch.setenv("XDG_DATA_HOME", "/home/someone/.local/share")
    monkeypatch.setattr(units, "memoryd_command", lambda: ("/var/tmp/venv/bin/memoryd",))
    assert units.detect().private_tmp is False


# --- rendering -------------------------------------------------------------------------------


@pytest.mark.parametrize(("arg", "word"), [
    ("/usr/bin/memoryd", "/usr/bin/memoryd"),
    ("serve", "serve"),
    ("/home/a b/memoryd", '"/home/a b/memoryd"'),
    ("/home/100%/memoryd", "/home/100%%/memoryd"),
    ("/home/$USER/memoryd", "/home/$$USER/memoryd"),
    ('/home/say "hi"/m', '"/home/say \\"hi\\"/m"'),
    ("/home/back\\slash/m", '"/home/back\\\\slash/m"'),
    (";", '";"'),
    ("", '""'),
])
def test_words_are_literal_in_a_unit_file(arg: str, word: str) -> None:
    assert units.quote(arg) == word


def test_paths_outside_a_command_keep_their_dollar() -> None:
    """Only command lines expand $VARIABLES; ReadWritePaths= takes $ literally."""
    assert units.quote("/home/$USER/x", command=False) == "/home/$USER/x"
    assert units.quote("/home/a b/100%", command=False) == '"/home/a b/100%%"'


def test_a_control_character_in_a_path_is_refused() -> None:
    with pytest.raises(units.UnitError, match=r"^a control character cannot go into a unit file: '/a\\nb'$"):
        units.quote("/a\nb")
    install = units.Install(("/opt/x\nExecStartPost=/bin/evil",), (), Path("/s"), "/bin/mkdir")
    with pytest.raises(units.UnitError):
        units.render(install)


def test_the_units_say_what_the_issue_asks() -> None:
    install = units.Install(("/opt/md/bin/memoryd",), ("file:///opt/md/README.md",), Path("/home/u/.local/share/memoryd"),
                            "/usr/bin/mkdir")
    sock = parse_unit(units.render_socket(install))
    service = parse_unit(units.render_service(install))
    assert sock["Unit"]["Documentation"] == ["file:///opt/md/README.md"]
    assert sock["Socket"] == {"ListenStream": ["%t/memoryd/memoryd.sock"], "SocketMode": ["0600"],
                              "DirectoryMode": ["0700"], "Accept": ["no"]}
    assert sock["Install"] == {"WantedBy": ["sockets.target"]}
    assert service["Unit"]["Documentation"] == ["file:///opt/md/README.md"]
    assert service["Unit"]["Requires"] == service["Unit"]["After"] == ["memoryd.socket"]
    svc = service["Service"]
    assert svc["Type"] == ["notify"]
    assert svc["ExecStart"] == ["/opt/md/bin/memoryd serve"]
    assert svc["ExecStartPre"] == ["+/usr/bin/mkdir -p -m 0700 /home/u/.local/share/memoryd"]
    assert svc["ReadWritePaths"] == ["/home/u/.local/share/memoryd %t/memoryd"]
    assert svc["RestrictAddressFamilies"] == ["AF_UNIX"]
    for key in ("PrivateUsers", "PrivateTmp", "PrivateNetwork", "NoNewPrivileges", "MemoryDenyWriteExecute",
                "LockPersonality", "RestrictRealtime"):
        assert svc[key] == ["yes"], key
    assert svc["ProtectSystem"] == ["strict"]
    assert svc["ProtectHome"] == ["read-only"]
    assert service["Install"] == {"Also": ["memoryd.socket"]}
    # every file says what generated it and for which memoryd
    for text in units.render(install).values():
        assert text.startswith("# Generated by `memoryd systemd-units` (memoryd 0.1.0) for the memoryd at\n"
                               "#   /opt/md/bin/memoryd\n")


def test_without_private_tmp_the_unit_says_why() -> None:
    install = units.Install(("/tmp/venv/bin/memoryd",), (), Path("/tmp/store"), "/bin/mkdir", private_tmp=False)
    text = units.render_service(install)
    assert "PrivateTmp" not in parse_unit(text)["Service"]
    assert "# No PrivateTmp=: memoryd or its store is under /tmp or /var/tmp, which it would hide.\n" in text


def test_the_interpreter_fallback_is_one_exec_start() -> None:
    install = units.Install(("/opt/py 3/bin/python3", "-m", "memoryd"), (), Path("/s"), "/bin/mkdir")
    (exec_start,) = parse_unit(units.render_service(install))["Service"]["ExecStart"]
    assert exec_start == '"/opt/py 3/bin/python3" -m memoryd serve'


# --- the command -----------------------------------------------------------------------------


def test_stdout_gets_both_units_each_under_a_header(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["systemd-units"]) == 0
    out, err = capsys.readouterr()
    rendered = units.render(units.detect())
    assert out == "".join(f"# ---- {name} (save as ~/.config/systemd/user/{name}) ----\n{text}\n"
                          for name, text in rendered.items())
    assert err == ("memoryd: to install them: memoryd systemd-units --output-dir ~/.config/systemd/user && "
                   "systemctl --user daemon-reload && systemctl --user enable --now memoryd.socket\n")


def test_output_dir_writes_both_units_and_prints_the_next_step(capsys: pytest.CaptureFixture[str]) -> None:
    unit_dir = Path(os.environ["XDG_CONFIG_HOME"]) / "systemd" / "user"
    assert cli.main(["systemd-units", "--output-dir", str(unit_dir)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == (f"wrote {unit_dir / 'memoryd.socket'}\nwrote {unit_dir / 'memoryd.service'}\n"
                   "next: systemctl --user daemon-reload && systemctl --user enable --now memoryd.socket\n")
    rendered = units.render(units.detect())
    assert sorted(p.name for p in unit_dir.iterdir()) == ["memoryd.service", "memoryd.socket"]
    for name, text in rendered.items():
        assert (unit_dir / name).read_text() == text
    # regenerating (after a reinstall) replaces them
    (unit_dir / "memoryd.service").write_text("stale")
    assert cli.main(["systemd-units", "--output-dir", str(unit_dir)]) == 0
    assert (unit_dir / "memoryd.service").read_text() == rendered["memoryd.service"]


def test_output_dir_elsewhere_says_systemd_will_not_read_it(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["systemd-units", "--output-dir", str(tmp_path / "a" / "b")]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[2] == (f"note: systemd --user does not read {tmp_path / 'a' / 'b'}; ~/.config/systemd/user "
                                   "is the usual place (systemd.unit(5), User Unit Search Path)")
    assert (tmp_path / "a" / "b" / "memoryd.socket").is_file()


def test_an_unwritable_output_dir_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["systemd-units", "--output-dir", str(blocker / "units")]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"memoryd: cannot write the units to {blocker / 'units'}: Not a directory\n"


def test_add_parser_gives_memoryd_a_systemd_units_subcommand(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="memoryd")
    units.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["systemd-units", "--output-dir", str(tmp_path)])
    assert args.command == "systemd-units"
    assert units.run(args) == 0
    assert (tmp_path / "memoryd.service").is_file()
    assert parser.parse_args(["systemd-units"]).output_dir is None


# --- systemd-analyze -------------------------------------------------------------------------


@needs_systemd_analyze
def test_systemd_analyze_verify_passes_on_the_generated_units(tmp_path: Path) -> None:
    sock, service = write_units(units.detect(), tmp_path / "units")
    r = analyze("verify", "--user", str(sock), str(service), cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@needs_systemd_analyze
def test_systemd_analyze_verify_passes_with_awkward_paths(tmp_path: Path) -> None:
    install = install_at(tmp_path / "my venv 100%")
    install = units.Install(install.exec_start, install.documentation, tmp_path / 'st ore$x "q"', install.mkdir)
    sock, service = write_units(install, tmp_path / "units")
    assert parse_unit(service.read_text())["Service"]["ReadWritePaths"] == [
        f'"{tmp_path}/st ore$x \\"q\\"" %t/memoryd']
    r = analyze("verify", "--user", str(sock), str(service), cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@needs_systemd_analyze
def test_systemd_analyze_verify_catches_a_missing_memoryd(tmp_path: Path) -> None:
    """The check is real: a unit whose memoryd is gone does not verify."""
    install = units.Install((str(tmp_path / "gone" / "memoryd"),), (), tmp_path / "store", "/bin/mkdir")
    sock, service = write_units(install, tmp_path / "units")
    r = analyze("verify", "--user", str(sock), str(service), cwd=tmp_path)
    assert r.returncode != 0
    assert f"Command {tmp_path / 'gone' / 'memoryd'} is not executable: No such file or directory" in r.stderr


def exposure(service: Path, cwd: Path) -> float:
    r = analyze("security", "--user", "--offline=true", "--threshold=40", service.name, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    (score,) = EXPOSURE.findall(r.stdout)
    return float(score)


def typical_install() -> units.Install:
    """memoryd installed and storing under the home directory, as most users have it."""
    return units.Install(("/home/someone/.local/bin/memoryd",), ("file:///x/README.md",),
                         Path("/home/someone/.local/share/memoryd"), "/usr/bin/mkdir")


def systemd_version() -> str:
    r = analyze("--version", cwd=ROOT)
    m = re.match(r"systemd (\d+) ", r.stdout)
    assert r.returncode == 0 and m is not None, r.stdout + r.stderr
    return m[1]


@needs_systemd_analyze
def test_security_exposure_of_a_typical_install_is_at_most_4(tmp_path: Path) -> None:
    _, service = write_units(typical_install(), tmp_path / "units")
    assert exposure(service, tmp_path / "units") <= 4.0


@needs_systemd_analyze
def test_security_exposure_of_this_install_is_at_most_4(tmp_path: Path) -> None:
    install = units.detect()  # under /tmp here (pytest's tmp dirs): no PrivateTmp=
    assert not install.private_tmp
    _, service = write_units(install, tmp_path / "units")
    assert exposure(service, tmp_path / "units") <= 4.0


@needs_systemd_analyze
def test_the_readme_quotes_the_security_exposure_measured_here(tmp_path: Path) -> None:
    """The README's figures are this systemd-analyze's, for a typical install and for one
    under /tmp (this test run's, whose store is in pytest's tmp dirs): they cannot drift."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    quoted = README_EXPOSURE.search(readme)
    assert quoted is not None, f"README.md's Running under systemd no longer says {README_EXPOSURE.pattern!r}"
    _, typical = write_units(typical_install(), tmp_path / "typical")
    install = units.detect()
    assert not install.private_tmp
    _, temporary = write_units(install, tmp_path / "temporary")
    measured = (f"{exposure(typical, typical.parent):.1f}", systemd_version(),
                f"{exposure(temporary, temporary.parent):.1f}")
    assert quoted.groups() == measured, (
        f"README.md quotes (typical, systemd version, under /tmp) = {quoted.groups()}; systemd-analyze here measures {measured}: "
        "quote these")


@needs_systemd_analyze
def test_security_threshold_check_is_real(tmp_path: Path) -> None:
    """The same command fails an unhardened service, so the ≤ 4.0 above is measured, not assumed."""
    units_dir = tmp_path / "units"
    units_dir.mkdir()
    (units_dir / "memoryd.service").write_text("[Service]\nType=notify\nExecStart=/bin/true\n")
    r = analyze("security", "--user", "--offline=true", "--threshold=40", "memoryd.service", cwd=units_dir)
    assert r.returncode != 0
    (score,) = EXPOSURE.findall(r.stdout)
    assert float(score) > 4.0


# --- the generated ExecStart under socket activation ----------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths are limited to ~107 bytes; pytest's tmp paths can be longer."""
    path = Path(tempfile.mkdtemp(prefix="md-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_generated_exec_start_serves_the_inherited_socket_and_the_store_the_unit_makes_writable(
        short_dir: Path) -> None:
    """What systemd does: bind ListenStream, pass it as fd 3 with LISTEN_FDS/LISTEN_PID, run
    ExecStart with NOTIFY_SOCKET, wait for READY=1. The daemon must serve the socket and open
    its store inside the directory that ReadWritePaths= leaves writable."""
    service = parse_unit(units.render(units.detect())[units.SERVICE_UNIT])["Service"]
    (exec_start,) = service["ExecStart"]
    argv = shlex.split(exec_start)  # plain paths here: the unit's quoting is shell-compatible
    assert argv[-1] == "serve" and Path(argv[0]).is_absolute()
    (writable,) = service["ReadWritePaths"]
    store_dir, *_, runtime = shlex.split(writable)
    assert runtime == "%t/memoryd"

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(short_dir / "memoryd.sock"))
    listener.listen(8)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(short_dir / "notify"))
    notify.settimeout(30)
    fd = listener.fileno()

    def as_fd3() -> None:
        os.dup2(fd, 3)

    env = dict(os.environ, LISTEN_FDS="1", NOTIFY_SOCKET=str(short_dir / "notify"))
    # systemd sets LISTEN_PID to the service's pid; `exec` keeps the shell's pid for memoryd
    proc = subprocess.Popen(["sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", *argv], env=env, preexec_fn=as_fd3,
                            close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        assert notify.recv(64) == b"READY=1"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(str(short_dir / "memoryd.sock"))
            c.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon/status"}\n')
            reply = json.loads(c.makefile("rb").readline())
        store = Path(reply["result"]["store"]["path"])
        assert store.parent == Path(store_dir)
        assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700
        # the daemon bound nothing of its own: the default runtime dir holds no socket
        assert not (Path(os.environ["XDG_RUNTIME_DIR"]) / "memoryd" / "memoryd.sock").exists()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        listener.close()
        notify.close()
    log = err.decode(errors="replace")
    assert proc.returncode == 0, log
    # it names the socket it serves, not the default path it did not bind
    ready = [line.partition(": ")[2] for line in log.splitlines() if "memoryd ready" in line]
    assert ready == [f"memoryd ready ({short_dir / 'memoryd.sock'}, store {store})"], log


def test_memoryd_systemd_units_is_the_installed_command(tmp_path: Path) -> None:
    """The README's command, as a user runs it: the installed console script."""
    script = Path(sys.executable).parent / "memoryd"
    out = tmp_path / "units"
    r = subprocess.run([str(script), "systemd-units", "--output-dir", str(out)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["memoryd.service", "memoryd.socket"]
    assert (out / "memoryd.service").read_text() == units.render(units.detect())["memoryd.service"]
