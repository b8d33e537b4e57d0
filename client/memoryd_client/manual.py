"""``memoryctl completion SHELL`` and the parser that the man page and the completion
scripts are generated from: memoryctl's own, with every verb and action complete."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .running import EXIT_OK, Ctx, UsageError

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    from .parsing import Parser

SHELLS = ("bash", "zsh", "fish")

#: the man page, generated from :func:`full_parser` by argparse-manpage (a development
#: dependency) and shipped as share/man/man1/memoryctl.1
MAN_PAGE = Path(__file__).resolve().parents[2] / "docs" / "memoryctl.1"


def man_page_command(output: Path) -> list[str]:
    """The argparse-manpage command line that writes the man page to ``output``; its date
    is ``$SOURCE_DATE_EPOCH``'s (tests/test_manual.py regenerates it with the shipped one's)."""
    from memoryd_protocol import __version__

    return ["argparse-manpage", "--module", "memoryd_client.manual", "--function", "full_parser",
            "--prog", "memoryctl", "--project-name", "memoryd", "--version", __version__,
            "--manual-title", "memoryd manual", "--description", "manage memoryd, the local memory daemon",
            "--output", str(output)]


def full_parser(*, global_help: bool = False) -> Parser:
    """memoryctl's parser with the options of every verb and action added (they are added
    on first use otherwise), for argparse-manpage and shtab, which read them all. With
    ``global_help`` each verb lists the global options too, which completes them after it."""
    from .cli import build_parser, verbs

    parser = build_parser(global_help=global_help)
    for verb in verbs(parser).values():
        verb.actions_completed()  # type: ignore[attr-defined]
    return parser


def _parsers(parser: Parser) -> list[Parser]:
    verbs = list(parser.verb_parsers.values())
    return [parser, *verbs, *(a for v in verbs for a in getattr(v, "action_parsers", {}).values())]


def script(shell: str) -> str:
    """The completion script for ``shell``: verbs, actions, options and choices from the
    parser; paths completed where an option takes a file or directory."""
    import shtab

    parser = full_parser(global_help=True)
    for p in _parsers(parser):
        # shtab describes a verb by its description's first line; the summary is the line for it
        p.description = getattr(p, "summary", None) or p.description
        for action in p.added:
            if action.metavar in ("PATH", "FILE"):
                action.complete = shtab.FILE  # type: ignore[attr-defined]
            elif action.metavar == "DIR":
                action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    return shtab.complete(parser, shell=shell)


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
        "bash": "new bash shells complete memoryctl (bash-completion loads it on first use)",
        "zsh": f"add  fpath=({path.parent} $fpath)  before compinit in ~/.zshrc, then start a new zsh",
        "fish": "new fish shells complete memoryctl",
    }[a.shell]
    print(f"memoryctl: installed the {a.shell} completion; {after}", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":  # python -m memoryd_client.manual: write docs/memoryctl.1 again
    import subprocess

    # a fixed width, so the page does not depend on the terminal it was made in
    sys.exit(subprocess.run(man_page_command(MAN_PAGE), env={**os.environ, "COLUMNS": "80"}).returncode)
