"""memoryctl's read commands' quick path (memoryd_client.quick): what it imports, that it
prints what the async path prints, byte for byte, that it reads a command line as the
parser does, that the shapes it checks results against are the wire Structs', and the
stdlib stand-ins it uses (cleandoc, the terminal width, pathlib's string form, the ASCII
escapes) against the originals.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memoryd_client import cli, cliparser, commands, quick, running, verbtable
from memoryd_protocol import approval_text, methods, paths
from memoryd_protocol import types as T

pytestmark = pytest.mark.inprocess

UG = ["--track", "user", "--scope", "user-global"]
#: what the quick path must not import: the async client's stack, and the stdlib modules
#: it was made to do without
HEAVY = ("anyio", "asyncio", "msgspec", "memoryd_protocol.types", "memoryd_client.client", "memoryd_client.commands",
         "memoryd_client.prompt", "typing", "inspect", "dataclasses", "textwrap", "pathlib", "shutil", "tempfile",
         "subprocess")


@pytest.fixture(autouse=True)
def hermetic_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMORYD_SOCKET", raising=False)
    for var in ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        path = tmp_path / "xdg" / var.lower()
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(path))


def seed(daemon: Any, capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("Prefers tabs over spaces", "Uses vim\tinside tmux", "数据库 is postgres"):
        assert cli.main(["--socket", str(daemon.socket_path), "--no-autostart", "-y", "add", *UG, "--tag", "t", text]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("verb", [["query", "postgres"], ["query"], ["list", "--track", "user"], ["status"],
                                  ["budgets"]])
def test_the_quick_path_imports_neither_the_async_client_nor_its_stdlib(daemon: Any, verb: list[str]) -> None:
    code = ("import sys\n"
            "from memoryd_client.cli import main\n"
            f"rc = main(['--socket', {str(daemon.socket_path)!r}, '--no-autostart', *{verb!r}])\n"
            f"print(rc, [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.stderr.splitlines()[-1] == "0 []", r.stderr
    assert r.stdout


def test_json_output_and_writes_still_take_the_async_client(daemon: Any) -> None:
    code = ("import sys\n"
            "from memoryd_client.cli import main\n"
            f"rc = main(['--socket', {str(daemon.socket_path)!r}, '--no-autostart', '--json', 'budgets'])\n"
            "print(rc, 'memoryd_client.commands' in sys.modules, file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.stderr.splitlines()[-1] == "0 True", r.stderr
    assert [row["track"] for row in json.loads(r.stdout)] == ["user", "user", "agent", "agent"]


def _both(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """``argv`` through the quick path (main), then through the async client (as main runs
    a verb that is not a lean one): (exit status, stdout, stderr) of each."""
    capsys.readouterr()
    quick = cli.main(argv)
    q_out, q_err = capsys.readouterr()
    parser = cli.build_parser()
    args = cli._parse(parser, argv)
    slow = commands.run_async(cli.Ctx(args, socket=cli._socket(args), fit=False))
    s_out, s_err = capsys.readouterr()
    return (quick, q_out, q_err), (slow, s_out, s_err)


@pytest.mark.parametrize("verb", [["query", "postgres"], ["query", "--limit", "2"], ["query", "nothing-like-this"],
                                  ["query", "--as-session", "--session", "q-1", "vim"], ["list"],
                                  ["list", "--scope", "workspace"], ["budgets"]])
def test_the_quick_path_prints_what_the_async_path_prints(daemon: Any, capsys: pytest.CaptureFixture[str],
                                                          verb: list[str]) -> None:
    seed(daemon, capsys)
    quick, slow = _both(["--socket", str(daemon.socket_path), "--no-autostart", *verb], capsys)
    assert quick == slow
    assert quick[0] == 0 and quick[1]


def test_status_on_both_paths(daemon: Any, capsys: pytest.CaptureFixture[str]) -> None:
    quick, slow = _both(["--socket", str(daemon.socket_path), "--no-autostart", "status"], capsys)

    def fields(out: str) -> dict[str, str]:
        rows = [line.split(None, 1) if not line.startswith(("pending", "queue", "write", "store")) else
                line.rsplit(None, 1) for line in out.split("\n\n")[0].splitlines()]
        return {k.strip(): v for k, v in rows if k.strip() not in ("uptime", "connections")}

    assert (quick[0], quick[2]) == (slow[0], slow[2]) == (0, "")
    assert fields(quick[1]) == fields(slow[1])
    assert quick[1].split("\n\n")[1].splitlines()[0] == slow[1].split("\n\n")[1].splitlines()[0]  # the CONN header


def test_no_daemon_and_db_warning_on_both_paths(daemon: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    none = ["--socket", str(tmp_path / "none.sock"), "--no-autostart", "query", "x"]
    quick, slow = _both(none, capsys)
    assert quick == slow and quick[0] == 3 and "CONNECT_FAILED" in quick[2]
    other = ["--socket", str(daemon.socket_path), "--no-autostart", "--db", str(tmp_path / "other.db"), "budgets"]
    quick, slow = _both(other, capsys)
    assert quick == slow and "warning: the daemon at" in quick[2]


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
def test_a_result_that_breaks_the_contract_is_the_same_bad_response(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    result: Any) -> None:
    with fake_daemon(tmp_path, {"memory/query": result}) as path:
        quick, slow = _both(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert quick == slow
    assert quick[0] == 1 and quick[2].startswith("error: BAD_RESPONSE: memory/query result does not fit")


def test_extra_fields_and_ints_for_floats_fit_as_msgspec_has_them(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    result = {"entries": [{**ENTRY, "future": 1}], "total": 1, "truncated": False, "future": [1]}
    with fake_daemon(tmp_path, {"memory/query": result}) as path:
        quick, slow = _both(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert quick == slow and quick[0] == 0 and "Prefers tabs" in quick[1]


def test_noise_before_the_answer_is_skipped_on_both_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    noise = (b'{"jsonrpc":"2.0","id":2,"result":NaN}\n'  # not JSON: unreadable
             b'not json\n{"jsonrpc":"2.0","method":"memory/recalled","params":{}}\n'
             b'{"jsonrpc":"2.0","id":"x","method":"client/ping","params":{}}\n'  # a request: refused
             b'{"jsonrpc":"2.0","id":99,"result":{}}\n[{"jsonrpc":"2.0","method":"x"}]\n')
    result = {"entries": [ENTRY], "total": 1, "truncated": False}
    with fake_daemon(tmp_path, {"memory/query": result}, before=noise) as path:
        quick, slow = _both(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert quick == slow and quick[0] == 0 and "Prefers tabs" in quick[1]


@pytest.mark.parametrize("line", [
    b'{"jsonrpc":"2.0","id":2,"result":"\\ud800"}\n',
    b'{"jsonrpc":"2.0","id":2,"result":{"x":["\\udc00\\ud83d"]}}\n',
    b'{"jsonrpc":"2.0","id":2,"result":[],"pad":"' + b"x" * 20000 + b'\\uDBFF"}\n',  # long, in any field
])
def test_a_line_with_a_lone_surrogate_is_skipped_on_both_paths(tmp_path: Path, line: bytes,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Python's json decodes a lone UTF-16 surrogate's escape, msgspec refuses the line: the
    async client skips it as unreadable, and so does the quick path (which took it for the
    answer, and crashed with a traceback re-encoding it), and both print the answer."""
    result = {"entries": [ENTRY], "total": 1, "truncated": False}
    with fake_daemon(tmp_path, {"memory/query": result}, before=line) as path:
        quick, slow = _both(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert quick == slow and quick[0] == 0 and "Prefers tabs" in quick[1]


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
def test_what_json_reads_and_msgspec_does_not_is_the_same_bad_response(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: list[str], line: bytes) -> None:
    """An answer json reads but msgspec does not (a number out of float's range, which json
    reads as infinity; a lone surrogate's UTF-8 bytes, which json decodes with
    surrogatepass): the quick path judged what json made of it (a status with an infinite
    uptime, an entry it printed), or msgspec's encoding of that (null for infinity); it is
    the daemon's bytes that msgspec judges, as on the async path."""
    with fake_daemon(tmp_path, {"memory/query": {"entries": [], "total": 0, "truncated": False},
                                "daemon/status": STATUS}, before=line) as path:
        quick, slow = _both(["--socket", str(path), "--no-autostart", *verb], capsys)
    assert quick == slow and quick[0] == 1 and quick[2].startswith("error: BAD_RESPONSE: "), (quick, slow)


@pytest.mark.parametrize(("init", "code", "error"), [
    ({ERROR: {"code": -32602, "message": "bad protocol", "data": {"code": "INVALID_INPUT", "details": {}}}}, 1,
     "error: INVALID_INPUT: bad protocol\n"),
    ({ERROR: {"code": -32603, "message": "boom"}}, 1, "error: INTERNAL_ERROR: boom\n"),
    (CLOSE, 3, "error: CONNECTION_CLOSED: connection closed by the daemon\n"),
])
def test_a_failed_initialize_fails_both_paths_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   init: Any, code: int, error: str) -> None:
    result = {"entries": [ENTRY], "total": 1, "truncated": False}
    with fake_daemon(tmp_path, {"initialize": init, "memory/query": result}) as path:
        quick, slow = _both(["--socket", str(path), "--no-autostart", "query"], capsys)
    assert quick == slow == (code, "", error)


def test_no_answer_is_the_same_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with fake_daemon(tmp_path, {"memory/query": None}) as path:
        quick, slow = _both(["--socket", str(path), "--no-autostart", "--timeout", "0.2", "query"], capsys)
    assert quick == slow
    assert quick[0] == 3 and quick[2] == "error: TIMEOUT: memory/query: no answer from memoryd within 0.2s\n"


# --- the command line, read without argparse ----------------------------------------------


def parsed(argv: list[str]) -> dict[str, Any] | None:
    """What argparse makes of ``argv`` (None: it refused it, or printed help)."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return vars(cli._parse(cli.build_parser(), argv))
        except SystemExit:
            return None


@pytest.mark.parametrize("argv", [
    ["query", "postgres"], ["query"], ["status"], ["budgets"], ["list"], ["query", ""],
    ["--socket", "/s.sock", "--no-autostart", "query", "postgres"],
    ["query", "postgres", "--socket", "/s.sock", "--no-autostart"],
    ["--socket=/a", "query", "--socket", "/b", "x"],
    ["query", "--limit", "5", "--track", "user", "--scope", "workspace", "--as-session", "x"],
    ["query", "--limit= 7", "x", "--agent", "", "--session", "s-1", "--workspace", "~/proj"],
    ["--cwd", "/w", "-y", "--yes", "--via-approver", "--timeout", "1e3", "status", "--timeout=2.5"],
    ["--db", "d.db", "--config", "c.toml", "budgets"], ["list", "--track", "agent", "--scope", "user-global"],
    ["--agent", "query", "query", "list"], ["query", "--limit", "5_0", "status"],
])
def test_a_plain_read_command_is_read_as_the_parser_reads_it(argv: list[str]) -> None:
    args = quick.quick_args(argv)
    assert args is not None
    assert vars(args) == parsed(argv)


@pytest.mark.parametrize("argv", [
    [], ["--help"], ["query", "-h"], ["--version"], ["query", "--json", "x"], ["--json", "status"], ["add", "x"],
    ["query", "a", "b"], ["list", "x"], ["status", "x"], ["query", "--lim", "5"], ["--sock", "/s", "status"],
    ["query", "--limit", "-5"], ["query", "--limit", "five"], ["--timeout", "0", "status"], ["--timeout", "nan", "status"],
    ["query", "--track", "users"], ["--track", "user", "query"], ["query", "--", "x"], ["query", "-x"],
    ["--socket", "status"], ["status", "--socket"], ["--agent=", "status"], ["--no-autostart=1", "status"],
    ["-yh", "status"], ["status", "--as-session"], ["socket"], ["x", "status"],
])
def test_anything_else_is_the_parsers(argv: list[str]) -> None:
    assert quick.quick_args(argv) is None


WORDS = st.sampled_from([
    "query", "list", "status", "budgets", "add", "socket", "--socket", "--db", "--config", "--no-autostart",
    "--timeout", "--json", "-y", "--yes", "--via-approver", "--workspace", "--cwd", "--agent", "--session",
    "--track", "--scope", "--limit", "--as-session", "--tag", "-h", "--", "--lim", "--socket=/s", "--limit=3",
    "--timeout=0", "--agent=", "user", "agent", "user-global", "workspace", "5", " 7", "x", "", "-1", "1e3", "0",
    "nan", "inf", "/tmp/s.sock", "~/w",
])


@settings(max_examples=600, deadline=None)
@given(st.lists(WORDS, max_size=8))
def test_what_quick_args_reads_the_parser_reads_the_same(argv: list[str]) -> None:
    args = quick.quick_args(argv)
    if args is not None:
        assert vars(args) == parsed(argv)


def test_memoryctl_query_imports_no_argparse(daemon: Any, tmp_path: Path) -> None:
    """A read command in a fresh interpreter: no argparse, gettext or locale (argparse's
    messages), no parser classes, no importlib, no json or re (leanjson reads its lines)."""
    code = ("import sys\n"
            "from memoryd_client.cli import main\n"
            f"rc = main(['--socket', {str(daemon.socket_path)!r}, '--no-autostart', 'query', 'x'])\n"
            "lean = ('argparse', 'gettext', 'locale', 'memoryd_client.parsing', 'importlib', 'pathlib', 'json', 're')\n"
            "print(rc, [m for m in lean if m in sys.modules], file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.stderr.splitlines()[-1] == "0 []", r.stderr


# --- the shapes are the Structs' ---------------------------------------------------------


def _kind(t: Any) -> Any:
    """A msgspec.inspect type as a quick path shape's kind."""
    mi = msgspec.inspect
    if isinstance(t, mi.StrType):
        return quick.STR
    if isinstance(t, mi.BoolType):
        return quick.BOOL
    if isinstance(t, mi.FloatType):
        return quick.FLOAT
    if isinstance(t, mi.IntType):
        assert t.gt is None and t.le is None and t.lt is None and t.multiple_of is None
        return ("int", t.ge)
    if isinstance(t, mi.LiteralType):
        return ("literal", tuple(sorted(t.values)))
    if isinstance(t, mi.ListType):
        return ("list", _kind(t.item_type))
    if isinstance(t, mi.UnionType):
        rest = [x for x in t.types if not isinstance(x, mi.NoneType)]
        assert len(rest) == 1 and len(t.types) == 2, t
        return ("null", _kind(rest[0]))
    if isinstance(t, mi.StructType):
        return (t.cls.__name__, [(f.name, f.encode_name, _kind(f.type), f.required) for f in t.fields])
    raise AssertionError(f"a type the quick path does not check: {t!r}")


def _shape(kind: Any) -> Any:
    if isinstance(kind, quick.Shape):
        return (kind.name, [(attr, wire, _shape(sub), required) for attr, wire, sub, required in kind.fields])
    if kind[0] in ("list", "null"):
        return (kind[0], _shape(kind[1]))
    if kind[0] == "literal":
        return ("literal", tuple(sorted(kind[1])))
    return kind


@pytest.mark.parametrize("method", sorted(quick.RESULTS))
def test_every_shape_is_its_struct(method: str) -> None:
    assert _shape(quick.RESULTS[method]) == _kind(msgspec.inspect.type_info(methods.RESULTS[method]))


def test_a_converted_result_reads_as_the_struct_does() -> None:
    wire = {"entries": [ENTRY], "total": 7, "truncated": True}
    got = quick.convert(quick.RESULTS["memory/query"], wire)
    want = msgspec.convert(wire, T.QueryResult)
    assert (got.total, got.truncated) == (want.total, want.truncated)
    assert vars(got.entries[0]) == msgspec.structs.asdict(want.entries[0])


# --- the stdlib stand-ins ------------------------------------------------------------------


def test_cleandoc_is_inspects_on_every_help_text(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    ours = verbtable.cleandoc

    def record(text: str) -> str:
        seen.append(text)
        return ours(text)

    monkeypatch.setattr(cliparser, "cleandoc", record)
    monkeypatch.setattr(verbtable, "cleandoc", record)
    cli.build_parser()
    assert len(seen) > 30
    for text in [*seen, "  a\n\n    b\n  c\n\n", "\tx\n\ty\n", "one", "", "\n\n  x  \n   \n", "a\n \n  b"]:
        assert ours(text) == inspect.cleandoc(text), repr(text)


@pytest.mark.parametrize("env", [{}, {"COLUMNS": "57"}, {"COLUMNS": "57", "LINES": "9"}, {"COLUMNS": "x"},
                                 {"COLUMNS": "0", "LINES": "3"}])
def test_the_terminal_width_is_shutils(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(running, "_COLUMNS", [])
    assert running._columns() == shutil.get_terminal_size().columns


def test_the_help_is_the_whole_parsers(capsys: pytest.CaptureFixture[str]) -> None:
    full = cli.build_parser()
    for verb, parser in cli.verbs(full).items():
        part = cli.build_parser([verb, "x", "--json"])
        assert cli.verbs(part)[verb].format_help() == parser.format_help(), verb
    assert tuple(cli.verbs(full)) == verbtable.VERB_NAMES
    assert cli.main(["--agent", "list"]) == 2  # no verb: the usage lists every verb
    err = capsys.readouterr().err
    assert all(v in err for v in verbtable.VERB_NAMES)
    assert cli.main(["--agent", "list", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and all(f"'{v}'" in err for v in verbtable.VERB_NAMES)


@pytest.mark.parametrize("word", ["-h", "--help", "--he", "--h", "-yh", "-hy", "--help=x"])
def test_help_words_build_every_verb(word: str) -> None:
    assert cliparser._named_verbs(["query", word]) is None


@pytest.mark.parametrize("argv", [
    ["--socket", "/s", "--no-autostart", "query", "postgres"], ["query"], ["--json", "list"], ["--agent", "list", "status"],
    ["query", "-1"], ["query", "x", "--limit", "3"], ["budgets", "--json"], ["-y", "query", "-"],
    ["--timeout", "5", "--session", "s", "--workspace", "/w", "query", "--as-session", "t"], ["list", "--track", "user"],
])
def test_the_parser_for_some_verbs_parses_as_the_whole_one(argv: list[str]) -> None:
    def parse(parser: Any) -> Any:
        try:
            return vars(cli._parse(parser, argv))
        except (cli._Partial, SystemExit) as exc:
            return type(exc).__name__

    whole = parse(cli.build_parser())
    assert isinstance(whole, dict)
    assert parse(cli.build_parser(argv)) == whole


def test_an_error_in_the_parser_for_some_verbs_goes_to_the_whole_one(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--limit", "3", "query"]
    with pytest.raises(cli._Partial):
        cli._parse(cli.build_parser(argv), argv)
    capsys.readouterr()
    assert cli.main(argv) == 2
    choices = ", ".join(f"'{v}'" for v in verbtable.VERB_NAMES)  # every verb, not only the one argv names
    assert capsys.readouterr().err == (f"error: USAGE: argument VERB: invalid choice: '3' (choose from {choices}) "
                                       "(see 'memoryctl --help')\n")


def test_option_values_that_name_verbs_are_parsed_as_argparse_does() -> None:
    argv = ["--agent", "list", "query", "--session", "status", "x"]
    assert cliparser._named_verbs(argv) == {"list", "query", "status"}
    args = cli._parse(cli.build_parser(argv), argv)
    assert (args.verb, args.agent, args.session, args.text) == ("query", "list", "status", "x")


@pytest.mark.parametrize("path", ["/tmp/m.sock", "/tmp//m.sock", "/tmp/./m.sock", "/tmp/m.sock/", "/tmp/.", "/",
                                  "//srv/m.sock", "///x", "rel.sock", "./rel.sock", "~/m.sock", "~", "/a/../b", ""])
def test_pathlib_str_is_pathlibs(path: str) -> None:
    assert paths.pathlib_str(path) == str(Path(path).expanduser())


@pytest.mark.parametrize(("socket_env", "xdg"), [(None, "/run/user/7"), (None, "/run/user/7/"), (None, "rel"),
                                                 ("/tmp/m.sock", None), ("/tmp//m.sock/", "/run"), ("~/m", None),
                                                 ("", "/run/u"), (None, None)])
def test_default_socket_is_default_socket_paths(monkeypatch: pytest.MonkeyPatch, socket_env: str | None,
                                                xdg: str | None) -> None:
    for var, value in (("MEMORYD_SOCKET", socket_env), ("XDG_RUNTIME_DIR", xdg)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    assert paths.default_socket() == str(paths.default_socket_path())


def test_the_lean_verbs_are_verbs() -> None:
    assert {"list", "query", "status", "budgets"} == quick.LEAN_VERBS
    assert quick.LEAN_VERBS <= set(cli.verbs())


def test_ascii_escapes_are_the_regular_expressions() -> None:
    """render.visible's ASCII path (str.translate) escapes what the pattern it replaced did."""
    import re

    from memoryd_client import render

    pattern = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
    text = "".join(chr(c) for c in range(128)) * 2
    assert render.visible(text) == pattern.sub(lambda m: approval_text._escape_char(m.group()), text).replace("\r", "\\r")
