"""memoryctl's parser, built from the verb table (:data:`memoryd_client.verbtable.VERBS`):
the front (memoryd_client.cli) parses with it, and the man page and ``memoryctl completion
SHELL``'s scripts are generated from it, with every verb and action complete."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

from memoryd_protocol import __version__
from memoryd_protocol.constants import PROTOCOL

from .parsing import FORMATTER, Parser, Verb, _global_options
from .running import EXIT_OK, PROG, Ctx, UsageError
from .verbtable import VERBS

SHELLS = ("bash", "zsh", "fish")

#: the man page, generated from :func:`build_parser` by argparse-manpage (a development
#: dependency) and shipped as share/man/man1/memoryctl.1
MAN_PAGE = Path(__file__).resolve().parents[2] / "docs" / "memoryctl.1"


def man_page_command(output: Path) -> list[str]:
    """The argparse-manpage command line that writes the man page to ``output``; its date
    is ``$SOURCE_DATE_EPOCH``'s (tests/test_manual.py regenerates it with the shipped one's)."""
    return ["argparse-manpage", "--module", "memoryd_client.manual", "--function", "build_parser",
            "--prog", "memoryctl", "--project-name", "memoryd", "--version", __version__,
            "--manual-title", "memoryd manual", "--description", "manage memoryd, the local memory daemon",
            "--output", str(output)]


def build_parser(*, global_help: bool = False) -> Parser:
    """memoryctl's parser, every verb's with it. With ``global_help`` each verb's help lists
    the global options too (the completion scripts read it to complete them after a verb)."""
    parser = Parser(
        prog=PROG,
        formatter_class=FORMATTER,
        description=inspect.cleandoc("""
            Manage memoryd, the local memory daemon (dsh-memory-protocol v1): read, write,
            audit, import and export memory, and approve writes.

            memoryctl connects to the daemon's socket and starts a daemon there when none
            answers (--no-autostart to disable). Writes under write policy 'ask' show the
            complete change and ask 'Approve? [y/N]' on the terminal; without a terminal
            they are denied unless --yes is given.
        """).strip(),
        epilog=inspect.cleandoc("""
            exit status:
              0    ok
              1    the daemon refused (its error code is on stderr), or audit verify found
                   the ledger broken
              2    usage: bad arguments, an unreadable input file
              3    no daemon, connection lost, timeout, or stop failed
              130  interrupted

            Run 'memoryctl VERB --help' for a verb's own options, 'man memoryctl' for the
            manual, and 'memoryctl completion bash|zsh|fish' for shell completion.
        """).strip(),
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {__version__} ({PROTOCOL})", help="print the version and exit"
    )
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs", parser_class=Verb)
    for verb in VERBS:
        parser.verb_parsers[verb.name] = sub.add_parser(
            verb.name, help=verb.summary, summary=verb.summary, description=verb.description, epilog=verb.epilog,
            formatter_class=FORMATTER, global_help=global_help, arguments=verb.arguments)
    return parser


def verbs(parser: Parser | None = None) -> dict[str, Verb]:
    """Verb name → its parser (for docs and tests)."""
    return (parser or build_parser()).verb_parsers


def _parsers(parser: Parser) -> list[Parser]:
    verbs = list(parser.verb_parsers.values())
    return [parser, *verbs, *(a for v in verbs for a in getattr(v, "action_parsers", {}).values())]


def script(shell: str) -> str:
    """The completion script for ``shell``: verbs, actions, options and choices from the
    parser; paths completed where an option takes a file or directory."""
    import shtab

    parser = build_parser(global_help=True)
    for p in _parsers(parser):
        # shtab describes a verb by its description's first line; the summary is the line for it
        p.description = getattr(p, "summary", None) or p.description
        for action in p.added:
            if action.metavar in ("PATH", "FILE"):
                action.complete = shtab.FILE  # type: ignore[attr-defined]
            elif action.metavar == "DIR":
                action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    return _own_header(shtab.complete(parser, shell=shell), shell)


#: each shell's install path as the headers and docs name it (``install_path`` without XDG)
SHOWN_PATHS = {
    "bash": "~/.local/share/bash-completion/completions/memoryctl",
    "zsh": "~/.local/share/zsh/site-functions/_memoryctl",
    "fish": "~/.config/fish/completions/memoryctl.fish",
}
_HEADERS = {
    "bash": f"""\
# memoryctl's bash completion, written by `memoryctl completion bash` (generated with shtab).
# `memoryctl completion bash --install` puts it in {SHOWN_PATHS["bash"]}
# ($XDG_DATA_HOME/bash-completion/completions/ when set), where the bash-completion package
# loads it on first use. Without bash-completion nothing loads that file: add the line
#   source {SHOWN_PATHS["bash"]}
# to ~/.bashrc. For this shell only: source <(memoryctl completion bash)
""",
    "zsh": f"""\
# memoryctl's zsh completion, written by `memoryctl completion zsh` (generated with shtab).
# `memoryctl completion zsh --install` puts it in {SHOWN_PATHS["zsh"]}
# ($XDG_DATA_HOME/zsh/site-functions/ when set); add that directory to $fpath before
# compinit in ~/.zshrc:  fpath=(~/.local/share/zsh/site-functions $fpath)
""",
    "fish": f"""\
# memoryctl's fish completion, written by `memoryctl completion fish` (generated with shtab).
# `memoryctl completion fish --install` puts it in {SHOWN_PATHS["fish"]}
# ($XDG_CONFIG_HOME/fish/completions/ when set), which new fish shells load.
""",
}


def _own_header(text: str, shell: str) -> str:
    """``text`` with shtab's usage comment replaced by one that names the path ``--install``
    writes (shtab's names another) and what to do where nothing loads it."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("# AUTOMATICALLY GENERATED by"))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("# See also:"))
    return "".join([*lines[:start], _HEADERS[shell], *lines[end + 1:]])


def bash_completion_loader() -> Path | None:
    """The bash-completion package's loader, where bash-completion itself looks for
    completions ($XDG_DATA_DIRS); None when it is not installed."""
    dirs = os.environ.get("XDG_DATA_DIRS") or "/usr/local/share:/usr/share"
    for d in dirs.split(":"):
        loader = Path(d or ".") / "bash-completion" / "bash_completion"
        if d and loader.is_file():
            return loader
    return None


def install_path(shell: str) -> Path:
    """Where each shell looks for a user's completion scripts (bash-completion 2 loads the
    file on first use; zsh needs the directory in $fpath before compinit; fish loads it)."""
    home = Path.home()
    data = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    return {
        "bash": data / "bash-completion" / "completions" / "memoryctl",
        "zsh": data / "zsh" / "site-functions" / "_memoryctl",
        "fish": config / "fish" / "completions" / "memoryctl.fish",
    }[shell]


def cmd_completion(ctx: Ctx) -> int:
    a = ctx.args
    text = script(a.shell)
    if not a.install:
        sys.stdout.write(text)
        return EXIT_OK
    path = install_path(a.shell)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(path)
    after = {
        "bash": _bash_after(path),
        "zsh": f"add  fpath=({path.parent} $fpath)  before compinit in ~/.zshrc, then start a new zsh",
        "fish": "new fish shells complete memoryctl",
    }[a.shell]
    print(f"memoryctl: installed the {a.shell} completion; {after}", file=sys.stderr)
    return EXIT_OK


def _bash_after(path: Path) -> str:
    loader = bash_completion_loader()
    if loader is None:
        return (f"nothing loads it yet, since bash-completion is not installed: add  source {path}  to ~/.bashrc "
                "(or install bash-completion), then start a new bash")
    return (f"bash-completion ({loader}) loads it on first use in new bash shells that load bash-completion "
            f"(most distributions' default ~/.bashrc does; if yours does not, add  source {path}  to it)")


if __name__ == "__main__":  # python -m memoryd_client.manual: write docs/memoryctl.1 again
    import subprocess

    # a fixed width, so the page does not depend on the terminal it was made in
    sys.exit(subprocess.run(man_page_command(MAN_PAGE), env={**os.environ, "COLUMNS": "80"}).returncode)
