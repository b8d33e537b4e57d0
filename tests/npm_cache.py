"""npm packages the tests run, installed outside the checkout.

A directory of the tests holding a package.json and its package-lock.json is installed with
``npm ci`` once, into a cache directory outside the checkout (``$MEMORYD_TEST_NODE_CACHE``,
else ``$XDG_CACHE_HOME/memoryd-tests``, else ``~/.cache/memoryd-tests``) named by the
directory's name and the hash of those two files: later sessions reuse it, a changed lock
installs afresh, and an flock keeps parallel workers to one install. npm's own download
cache goes to a temporary directory removed after the install, never ``~/.npm``: the cache
directory is all the tests leave behind (README's "Where files live" and "Uninstall"). node and npm are
required (the test run installs them as root): a missing one fails the tests, it does not skip them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

LOCK_FILES = ("package.json", "package-lock.json")
INSTALL_TIMEOUT_S = 900


def require(name: str) -> str:
    """The path of the command ``name``; the test fails without it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is required: these tests run npm packages (node >= 20 and npm; the test run "
                    "installs them when run as root: tests/system_tools.py)")
    return path


def cache_root() -> Path:
    explicit = os.environ.get("MEMORYD_TEST_NODE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "memoryd-tests"


def npm_env(cache: Path) -> dict[str, str]:
    """npm's environment: the user's npm settings dropped, its cache (and logs) in ``cache``."""
    env = {k: v for k, v in os.environ.items() if not k.lower().startswith("npm_config_")}
    env.update(npm_config_audit="false", npm_config_fund="false", npm_config_update_notifier="false",
               npm_config_cache=str(cache))
    return env


def npm_install(source: Path) -> Path:
    """The directory holding node_modules with ``source``'s pinned packages, installed if
    needed. ``--ignore-scripts``: none of the packages' install scripts runs (what one
    would do, e.g. copy a native binary over its launcher, the tests do themselves)."""
    require("node")
    npm = require("npm")
    digest = hashlib.sha256(b"".join((source / f).read_bytes() for f in LOCK_FILES)).hexdigest()[:16]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    home = root / f"{source.name}-{digest}"
    done = home / ".installed"
    with open(root / f"{source.name}-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir()
            for f in LOCK_FILES:
                shutil.copy2(source / f, home / f)
            with tempfile.TemporaryDirectory(prefix="memoryd-npm-cache-") as cache:
                r = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                                   cwd=home, env=npm_env(Path(cache)), capture_output=True, text=True,
                                   timeout=INSTALL_TIMEOUT_S)
            if r.returncode != 0:
                pytest.fail(f"npm ci of {source} into {home} failed ({r.returncode}):\n{r.stdout[-3000:]}"
                            f"\n{r.stderr[-6000:]}")
            done.write_text(digest + "\n")
    return home
