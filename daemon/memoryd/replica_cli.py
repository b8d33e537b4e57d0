"""``memoryd replica restore URL --to PATH``: a copy of a replica, for ``memoryctl restore``
and ``memoryctl audit verify --against``.

The clients never import the daemon, and Litestream runs from one module
(:mod:`memoryd.litestream`): memoryctl runs this command, which copies the replica's newest
state into a new file and checks nothing; memoryctl verifies the copy before it trusts it.
The endpoint, region and credentials file come from the config's ``[replicate]`` table when
its url is URL, the credentials otherwise from the environment; never from this command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .errors import DaemonError


def add_parser(sub: Any) -> None:
    """``memoryd replica``'s parser, on ``memoryd``'s subcommands ``sub``."""
    p = sub.add_parser(
        "replica", help="copy a replica of the store (memoryctl restore runs this)",
        description="Copy the newest state of a replica (file://, s3://, sftp://) into a new file with Litestream. "
        "The copy is not checked here: memoryctl restore verifies it before installing it.")
    actions = p.add_subparsers(dest="replica_action", required=True)
    restore = actions.add_parser("restore", help="copy the replica's newest state into a new file",
                                 description="Copy the replica at URL into PATH, which must not exist.")
    restore.add_argument("url", metavar="URL", help="the replica, as [replicate] url names it")
    restore.add_argument("--to", type=Path, required=True, metavar="PATH", help="the new file to write")
    restore.add_argument("--config", type=Path, help="TOML config file whose [replicate] gives URL's endpoint, "
                         "region and credentials file (default: the daemon's config file, if it exists)")


def _replica_table(url: str, config: Path | None) -> dict[str, Any]:
    """The config's ``[replicate]`` table when it names ``url``, else just the url."""
    from . import config as config_mod

    path = config.expanduser() if config is not None else config_mod.default_config_file()
    if path is None or not path.is_file():
        if config is not None:
            raise DaemonError(f"--config {config}: no such file")
        return {"url": url}
    import tomllib  # only with a config file, as config.load: every relay start imports this module

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DaemonError(f"cannot read the config file {path}: {exc}") from None
    table = raw.get("replicate")
    if isinstance(table, dict) and table.get("url") == url:
        return table
    return {"url": url}


def run(args: argparse.Namespace) -> int:
    from functools import partial

    import anyio

    from . import litestream, replica

    chosen = replica.parse(_replica_table(args.url, args.config))
    out = args.to.expanduser().absolute()
    anyio.run(partial(litestream.restore, chosen, out))
    return 0
