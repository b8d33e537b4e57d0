"""``memoryctl completion SHELL --install`` says what loads the script, and its header names
the path it is installed to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from memoryd_client import manual


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memoryd_client", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "XDG_DATA_HOME": "", "XDG_CONFIG_HOME": "", **env})


def test_without_bash_completion_install_says_nothing_loads_it_and_how_to(tmp_path: Path) -> None:
    (tmp_path / "share").mkdir()
    r = run("completion", "bash", "--install", env={"HOME": str(tmp_path), "XDG_DATA_DIRS": str(tmp_path / "share")})
    script = tmp_path / ".local/share/bash-completion/completions/memoryctl"
    assert (r.returncode, r.stdout) == (0, f"{script}\n")
    assert r.stderr == (f"memoryctl: installed the bash completion; nothing loads it yet, since bash-completion is "
                        f"not installed: add  source {script}  to ~/.bashrc (or install bash-completion), then start "
                        "a new bash\n")
    # the advice works: a bash that sources the file completes memoryctl
    bashrc = tmp_path / ".bashrc"
    bashrc.write_text(f"source {script}\n")
    done = subprocess.run(["bash", "--rcfile", str(bashrc), "-ic", "complete -p memoryctl"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and "_shtab_memoryctl" in done.stdout and " memoryctl" in done.stdout, done.stderr


def test_with_bash_completion_install_names_the_loader(tmp_path: Path) -> None:
    loader = tmp_path / "share" / "bash-completion" / "bash_completion"
    loader.parent.mkdir(parents=True)
    loader.write_text("# bash-completion\n")
    r = run("completion", "bash", "--install",
            env={"HOME": str(tmp_path), "XDG_DATA_DIRS": f"/nonexistent:{tmp_path / 'share'}"})
    script = tmp_path / ".local/share/bash-completion/completions/memoryctl"
    assert r.returncode == 0
    assert r.stderr == (f"memoryctl: installed the bash completion; bash-completion ({loader}) loads it on first use "
                        "in new bash shells that load bash-completion (most distributions' default ~/.bashrc does; "
                        f"if yours does not, add  source {script}  to it)\n")


@pytest.mark.parametrize("shell", manual.SHELLS)
def test_the_header_names_the_install_path_and_no_other(shell: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    text = run("completion", shell, env={"HOME": str(tmp_path)}).stdout
    header = [line for line in text.splitlines()[:12] if line.startswith("#")]
    shown = manual.SHOWN_PATHS[shell]
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert manual.install_path(shell) == Path(shown.replace("~", str(tmp_path), 1))
    assert any(shown in line for line in header), header
    for stale in ("bash_completion/", "zsh_completion", "AUTOMATICALLY GENERATED", "Copy this"):
        assert not any(stale in line for line in header), (stale, header)
    if shell == "zsh":
        assert text.startswith("#compdef memoryctl\n")  # compinit binds the function by this line
    if shell == "bash":
        assert f"#   source {shown}" in header
