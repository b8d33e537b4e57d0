"""Identity, without a daemon: who may connect, the refusal log's rate limit, and what makes
a socket directory private."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from memoryd.ratelog import RateLimitedLog
from memoryd.rundir import UnsafeDir, check_private_dir, ensure_private_dir
from memoryd.transports import peer_allowed


def test_the_daemons_own_uid_and_root_may_connect_nobody_else() -> None:
    assert peer_allowed(1000, 1000)
    assert peer_allowed(0, 1000)
    assert not peer_allowed(1001, 1000)
    assert not peer_allowed(65534, 1000)
    assert peer_allowed(0, 0)
    assert not peer_allowed(1000, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "memoryd.transports" and r.levelno == logging.WARNING]


def test_refusals_are_logged_one_by_one_up_to_a_burst_then_summed_up(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limiter = RateLimitedLog(logging.getLogger("memoryd.transports"), burst=3, clock=clock)
    caplog.set_level(logging.WARNING, "memoryd.transports")
    for n in range(10):
        limiter.say(f"refused {n}")
    assert warnings(caplog) == ["refused 0", "refused 1", "refused 2"]
    caplog.clear()
    clock.now += 59.9  # still the same window: nothing more
    limiter.say("refused 10")
    assert warnings(caplog) == []
    clock.now += 0.1  # the window is over: the next one counts the ones left out
    limiter.say("refused 11")
    limiter.say("refused 12")
    assert warnings(caplog) == ["refused 11 (8 more since the last report)", "refused 12"]
    caplog.clear()
    clock.now += 600  # a quiet window has nothing to sum up
    limiter.say("refused 13")
    assert warnings(caplog) == ["refused 13"]


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "base"
    d.mkdir(mode=0o700)
    yield d


def not_private(path: Path, uid: int, mode: int) -> str:
    return (f"the socket directory {path} is not private: owned by uid {uid} with mode {mode:04o}, not by uid "
            f"{os.geteuid()} with mode 0700; another user could replace the socket (remove the directory, or fix "
            "its owner and mode)")


def test_a_private_directory_passes_and_a_missing_one_is_created_private(base: Path) -> None:
    check_private_dir(base)
    fresh = base / "a" / "memoryd"
    check_private_dir(fresh, missing_ok=True)
    with pytest.raises(UnsafeDir, match=f"^the socket directory {fresh} does not exist$"):
        check_private_dir(fresh)
    old = os.umask(0o022)
    try:
        ensure_private_dir(fresh)
    finally:
        os.umask(old)
    assert fresh.stat().st_mode & 0o777 == 0o700
    ensure_private_dir(fresh)  # already there and ours: fine


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701, 0o1777])
def test_group_or_other_bits_are_refused_and_left_alone(base: Path, mode: int) -> None:
    d = base / "memoryd"
    d.mkdir()
    os.chmod(d, mode)
    for check in (check_private_dir, ensure_private_dir):
        with pytest.raises(UnsafeDir) as info:
            check(d)
        assert str(info.value) == not_private(d, os.geteuid(), mode)
    assert d.stat().st_mode & 0o7777 == mode  # never repaired: its owner would stay in control


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_directory_of_another_uid_is_refused_even_with_mode_0700(base: Path) -> None:
    d = base / "memoryd"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(UnsafeDir) as info:
        ensure_private_dir(d)
    assert str(info.value) == not_private(d, 65534, 0o700)


def test_a_symlink_or_a_file_is_not_a_socket_directory(base: Path) -> None:
    target = base / "real"
    target.mkdir(mode=0o700)
    link = base / "memoryd"
    link.symlink_to(target)
    with pytest.raises(UnsafeDir) as info:
        ensure_private_dir(link)
    assert str(info.value) == (f"the socket directory {link} is a symbolic link (owned by uid {os.geteuid()}); "
                               f"it must be a directory owned by uid {os.geteuid()} with mode 0700")
    plain = base / "file"
    plain.write_text("")
    with pytest.raises(UnsafeDir, match=f"^the socket directory {plain} is not a directory$"):
        ensure_private_dir(plain)
    assert plain.read_text() == "" and os.listdir(target) == []
