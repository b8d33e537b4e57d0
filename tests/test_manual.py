"""memoryctl's help, man page and shell completion: each generated from the one parser."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from memoryd_client import cli, manual, verbtable
from system_tools import require

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memoryd_client", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "80", **(env or {})})


def test_a_verbs_help_is_its_own_options_and_one_line_for_the_global_ones() -> None:
    r = run("add", "--help")
    assert r.returncode == 0
    assert "--socket PATH" not in r.stdout and "--via-approver" not in r.stdout
    assert r.stdout.rstrip().endswith(verbtable.GLOBAL_OPTIONS_LINE)
    assert len(r.stdout.splitlines()) <= 30
    for verb, parser in cli.verbs().items():  # every verb, every action: short, ending in the pointer
        for p in [parser, *parser.action_parsers.values()]:
            text = p.format_help()
            assert text.rstrip().endswith(verbtable.GLOBAL_OPTIONS_LINE), verb
            assert "--socket PATH" not in text, verb


def test_nested_verbs_have_their_own_help() -> None:
    r = run("audit", "verify", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: memoryctl audit verify [-h] [--heads FILE] [--against URL]\n")
    r = run("proposals", "approve", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: memoryctl proposals approve [-h] ID\n")
    r = run("audit", "explain")
    assert (r.returncode, r.stderr) == (2, "error: USAGE: the following arguments are required: TEXT|ID "
                                           "(see 'memoryctl audit explain --help')\n")


def test_the_top_level_epilog_lists_each_exit_status_on_its_own_line() -> None:
    out = run("--help").stdout
    epilog = out[out.index("exit status:"):]
    assert re.findall(r"^  (\d+) ", epilog, re.M) == ["0", "1", "2", "3", "130"]


@pytest.mark.parametrize(("argv", "said"), [
    (["lst"], "argument VERB: invalid choice: 'lst'; did you mean 'list'? (see 'memoryctl --help')"),
    (["stauts"], "argument VERB: invalid choice: 'stauts'; did you mean 'status'? (see 'memoryctl --help')"),
    (["audit", "verfy"], "argument ACTION: invalid choice: 'verfy'; did you mean 'verify'? "
                         "(see 'memoryctl audit --help')"),
    (["add", "--track", "usr", "--scope", "workspace", "x"],
     "argument --track: invalid choice: 'usr'; did you mean 'user'? (see 'memoryctl add --help')"),
])
def test_a_mistyped_word_says_did_you_mean(argv: list[str], said: str) -> None:
    r = run(*argv)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: USAGE: {said}\n")


def test_a_word_close_to_nothing_lists_the_choices() -> None:
    r = run("xyzzy")
    assert r.returncode == 2 and "invalid choice: 'xyzzy' (choose from 'list', 'query'," in r.stderr


def test_the_shipped_man_page_is_the_parsers(tmp_path: Path) -> None:
    shipped = manual.MAN_PAGE.read_text()
    date = re.match(r'\.TH MEMORYCTL "1" "([^"]+)"', shipped)
    assert date, "docs/memoryctl.1 has no .TH line"
    day = date[1].replace("\\-", "-")
    import datetime as dt

    epoch = int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp())
    out = tmp_path / "memoryctl.1"
    subprocess.run(manual.man_page_command(out), check=True, timeout=120,
                   env={**os.environ, "COLUMNS": "80", "SOURCE_DATE_EPOCH": str(epoch)})
    assert out.read_text() == shipped, "docs/memoryctl.1 is stale: run python -m memoryd_client.manual"
    installed = Path(sys.prefix) / "share" / "man" / "man1" / "memoryctl.1"
    assert installed.read_text() == shipped  # the package installs it where man looks
    shown = subprocess.run([require("man"), "-l", str(out)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "MANWIDTH": "80", "MANPAGER": "cat"})
    assert shown.returncode == 0 and "memoryctl audit verify" in shown.stdout


def _complete_bash(script: Path, *words: str) -> list[str]:
    line = " ".join(f'"{w}"' for w in words)
    r = subprocess.run(["bash", "-c", f'source {script}; COMP_WORDS=(memoryctl {line}); '
                        f'COMP_CWORD={len(words)}; _shtab_memoryctl; printf "%s\\n" "${{COMPREPLY[@]}}"'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_bash_completes_verbs_actions_options_and_choices(tmp_path: Path) -> None:
    script = tmp_path / "memoryctl.bash"
    r = run("completion", "bash")
    assert r.returncode == 0
    script.write_text(r.stdout)
    assert _complete_bash(script, "aud") == ["audit"]
    assert _complete_bash(script, "audit", "ver") == ["verify"]
    assert _complete_bash(script, "add", "--track", "") == ["user", "agent"]
    assert _complete_bash(script, "list", "--cw") == ["--cwd"]  # a global option, after the verb
    assert _complete_bash(script, "completion", "") == ["bash", "zsh", "fish"]


def test_fish_completes_verbs_and_actions(tmp_path: Path) -> None:
    script = tmp_path / "memoryctl.fish"
    script.write_text(run("completion", "fish").stdout)
    r = subprocess.run([require("fish"), "--no-config", "-c", f'source {script}; complete -C "memoryctl aud"; '
                        'complete -C "memoryctl audit ve"'], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "audit\tshow the audit ledger; verify its hash chain; explain one entry's life",
        "verify\tverify the hash chain, the audit rows and the live entries",
    ]


def test_zsh_loads_the_completion_and_knows_every_verb(tmp_path: Path) -> None:
    funcs = tmp_path / "site-functions"
    funcs.mkdir()
    (funcs / "_memoryctl").write_text(run("completion", "zsh").stdout)
    r = subprocess.run([require("zsh"), "-fc", f"fpath=({funcs} $fpath); autoload -Uz compinit && compinit -u -d "
                        f"{tmp_path}/zcompdump; autoload -Uz +X _memoryctl; print -r -- $functions[_memoryctl]; "
                        "print -r -- $_comps[memoryctl]"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.rstrip().endswith("_memoryctl")  # compinit bound memoryctl to it
    for verb in verbtable.VERB_NAMES:
        assert f"{verb}:" in r.stdout or verb in r.stdout, verb


@pytest.mark.parametrize("shell", manual.SHELLS)
def test_completion_install_writes_where_the_shell_looks(shell: str, tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_DATA_HOME": "", "XDG_CONFIG_HOME": ""}
    r = run("completion", shell, "--install", env=env)
    assert r.returncode == 0, r.stderr
    where = {"bash": ".local/share/bash-completion/completions/memoryctl",
             "zsh": ".local/share/zsh/site-functions/_memoryctl",
             "fish": ".config/fish/completions/memoryctl.fish"}[shell]
    assert r.stdout == f"{tmp_path / where}\n"
    assert (tmp_path / where).read_text() == run("completion", shell).stdout


def test_completion_install_into_an_unwritable_place_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file, not a directory")
    r = run("completion", "bash", "--install", env={"XDG_DATA_HOME": str(tmp_path / "data")})
    assert r.returncode == 2 and r.stderr.startswith(f"error: USAGE: cannot write {tmp_path}/data/")
