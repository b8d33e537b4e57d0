"""memoryctl against a daemon that breaks the contract, or says nothing: an answer that does
not fit is BAD_RESPONSE, noise before the answer is skipped, a failed initialize and a
silent daemon end in one line and the exit status each calls for.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from memoryd_client import cli
from memoryd_protocol import approval_text

pytestmark = pytest.mark.inprocess


@pytest.fixture(autouse=True)
def hermetic_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMORYD_SOCKET", raising=False)
    for var in ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        path = tmp_path / "xdg" / var.lower()
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(path))


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """memoryctl ``argv``: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_no_daemon_and_db_warning(daemon: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    none = ["--socket", str(tmp_path / "none.sock"), "--no-autostart", "query", "x"]
    got = run(none, capsys)
    assert got[0] == 3 and "CONNECT_FAILED" in got[2]
    other = ["--socket", str(daemon.socket_path), "--no-autostart", "--db", str(tmp_path / "other.db"), "budgets"]
    got = run(other, capsys)
    assert "warning: the daemon at" in got[2]


# --- a daemon that breaks the contract ------------------------------------------------------


ERROR = "__error__"
CLOSE: Any = object()


@contextmanager
def fake_daemon(tmp_path: Path, results: dict[str, Any], before: bytes = b"") -> Iterator[Path]:
    """A socket that answers each request with ``results[method]`` (initialize: a valid
    answer unless given; None: no answer at all; ``{"error": ...}`` under ERROR: that error;
    CLOSE: close the connection), one line per answer, ``before`` sent ahead of every
    answer but initialize's, for any number of connections."""
    path = tmp_path / "fake.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    init = {"protocol": "dsh-memory-protocol/v1", "server": {"name": "memoryd", "version": "0"}, "schemaVersion": 4,
            "writePolicy": "ask", "budgets": []}

    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                req = json.loads(line)
                if "method" not in req:  # the client's answer to a request of ours
                    continue
                result = results.get(req["method"], init if req["method"] == "initialize" else None)
                if result is None:
                    continue
                if result is CLOSE:
                    return
                ahead = b"" if req["method"] == "initialize" else before
                reply = {"error": result[ERROR]} if isinstance(result, dict) and ERROR in result else {"result": result}
                conn.sendall(ahead + json.dumps({"jsonrpc": "2.0", "id": req["id"], **reply}).encode() + b"\n")

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield path
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()


ENTRY = {"id": "3f2a1b2c-5d6e-4f70-8a9b-0c1d2e3f4a5b", "track": "user", "scope": "user-global", "workspaceKey": "",
         "agentKey": "", "text": "Prefers tabs", "source": "memoryctl", "tags": [], "version": 1, "createdAt": 1,
         "updatedAt": 1, "lastRecalled": None, "recallCount": 0, "sessionId": None}


@pytest.mark.parametrize("result", [
    {"entries": "not a list", "total": 1, "truncated": False},
    {"entries": [{**ENTRY, "version": 0}], "total": 1, "truncated": False},
    {"entries": [{**ENTRY, "track": "nobody"}], "total": 1, "truncated": False},
    {"entries": [ENTRY], "total": "1", "truncated": False},
    {"entries": [ENTRY], "total": 1},
    {"entries": [{**ENTRY, "tags": [1]}], "total": 1, "truncated": False},
    {"entries": [{**ENTRY, "createdAt": True}], "total": 1, "truncated": False},
])
def test_a_result_that_breaks_the_contract_is_a_bad_response(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    result: Any) -> None:
    with fake_daemon(tmp_path, {"memory/query": result}) as path:
        got = run(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert got[0] == 1 and got[2].startswith("error: BAD_RESPONSE: memory/query result does not fit")


def test_extra_fields_and_ints_for_floats_fit_as_msgspec_has_them(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    result = {"entries": [{**ENTRY, "future": 1}], "total": 1, "truncated": False, "future": [1]}
    with fake_daemon(tmp_path, {"memory/query": result}) as path:
        got = run(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert got[0] == 0 and "Prefers tabs" in got[1]


def test_noise_before_the_answer_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    noise = (b'{"jsonrpc":"2.0","id":2,"result":NaN}\n'  # not JSON: unreadable
             b'not json\n{"jsonrpc":"2.0","method":"memory/recalled","params":{}}\n'
             b'{"jsonrpc":"2.0","id":"x","method":"client/ping","params":{}}\n'  # a request: refused
             b'{"jsonrpc":"2.0","id":99,"result":{}}\n[{"jsonrpc":"2.0","method":"x"}]\n')
    result = {"entries": [ENTRY], "total": 1, "truncated": False}
    with fake_daemon(tmp_path, {"memory/query": result}, before=noise) as path:
        got = run(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert got[0] == 0 and "Prefers tabs" in got[1]


@pytest.mark.parametrize("line", [
    b'{"jsonrpc":"2.0","id":2,"result":"\\ud800"}\n',
    b'{"jsonrpc":"2.0","id":2,"result":{"x":["\\udc00\\ud83d"]}}\n',
    b'{"jsonrpc":"2.0","id":2,"result":[],"pad":"' + b"x" * 20000 + b'\\uDBFF"}\n',  # long, in any field
])
def test_a_line_with_a_lone_surrogate_is_skipped(tmp_path: Path, line: bytes,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """msgspec refuses a line with a lone UTF-16 surrogate's escape: the client skips it as
    unreadable and prints the answer."""
    result = {"entries": [ENTRY], "total": 1, "truncated": False}
    with fake_daemon(tmp_path, {"memory/query": result}, before=line) as path:
        got = run(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert got[0] == 0 and "Prefers tabs" in got[1]


STATUS = {"version": "0", "uptimeS": "UPTIME", "connections": 1, "pendingApprovals": 0, "queueDepth": 0,
          "store": {"path": "/x/m.db", "schemaVersion": 4}, "pid": 7, "writePolicy": "ask", "socket": None,
          "config": None, "log": None, "connectionList": []}
SURROGATE_TEXT = json.dumps({**ENTRY, "text": "RAW"}).encode().replace(b'"RAW"', b'"\xed\xa0\x80"')


@pytest.mark.parametrize(("verb", "line"), [
    (["query"], b'{"jsonrpc":"2.0","id":2,"result":{"entries":[],"total":1e400,"truncated":false}}\n'),
    (["query"], b'[{"jsonrpc":"2.0","id":2,"result":{"entries":[],"total":-1E999,"truncated":false}}]\n'),
    (["query"], b'{"jsonrpc":"2.0","id":2,"result":{"entries":[' + SURROGATE_TEXT + b'],"total":1,"truncated":false}}\n'),
    (["status"], b'{"jsonrpc":"2.0","id":2,"result":' + json.dumps(STATUS).encode().replace(b'"UPTIME"', b"1e400")
     + b'}\n'),
    (["status"], b'{"jsonrpc":"2.0","id":2,"result":' + json.dumps(STATUS).encode().replace(b'"UPTIME"', b"1" * 400)
     + b'}\n'),
])
def test_what_json_reads_and_msgspec_does_not_is_a_bad_response(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: list[str], line: bytes) -> None:
    """An answer msgspec does not read as the result (a number out of float's range, a lone
    surrogate's UTF-8 bytes) is BAD_RESPONSE."""
    with fake_daemon(tmp_path, {"memory/query": {"entries": [], "total": 0, "truncated": False},
                                "daemon/status": STATUS}, before=line) as path:
        got = run(["--socket", str(path), "--no-autostart", *verb], capsys)
    assert got[0] == 1 and got[2].startswith("error: BAD_RESPONSE: "), got


@pytest.mark.parametrize(("init", "code", "error"), [
    ({ERROR: {"code": -32602, "message": "bad protocol", "data": {"code": "INVALID_INPUT", "details": {}}}}, 1,
     "error: INVALID_INPUT: bad protocol\n"),
    ({ERROR: {"code": -32603, "message": "boom"}}, 1, "error: INTERNAL_ERROR: boom\n"),
    (CLOSE, 3, "error: CONNECTION_CLOSED: connection closed by the daemon\n"),
])
def test_a_failed_initialize_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   init: Any, code: int, error: str) -> None:
    result = {"entries": [ENTRY], "total": 1, "truncated": False}
    with fake_daemon(tmp_path, {"initialize": init, "memory/query": result}) as path:
        got = run(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert got == (code, "", error)


def test_no_answer_is_a_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with fake_daemon(tmp_path, {"memory/query": None}) as path:
        got = run(["--socket", str(path), "--no-autostart", "--timeout", "0.2", "query"], capsys)
    assert got[0] == 3 and got[2] == "error: TIMEOUT: memory/query: no answer from memoryd within 0.2s\n"


def test_ascii_escapes_are_the_regular_expressions() -> None:
    """render.visible's ASCII path (str.translate) escapes what the pattern it replaced did."""
    import re

    from memoryd_client import render

    pattern = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
    text = "".join(chr(c) for c in range(128)) * 2
    assert render.visible(text) == pattern.sub(lambda m: approval_text._escape_char(m.group()), text).replace("\r", "\\r")
