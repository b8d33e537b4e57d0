"""``memoryd serve --stdio``: a harness's way in to the one daemon that owns the store.

The relay connects to the daemon's socket (starting the daemon, detached, when none
answers), checks that it serves the configured store, then copies bytes both ways without
parsing them, so approvals, events, errors and ordering pass through unchanged. EOF on
stdin half-closes the connection: the daemon answers what was sent, and the relay exits 0.
The daemon closing first gives the harness EOF, one line on stderr, and exit status 1.

A harness spawns one per session.
"""

from __future__ import annotations

import _thread
import errno
import json
import os
import select
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memoryd_protocol.paths import default_db_path, log_path_for, read_owner_record

from .errors import DaemonError
from .rundir import UnsafeDir, check_private_dir, ensure_private_dir

CHUNK = 65536
PROBE_ID = "memoryd-relay-probe"
#: The relay's own question: what the daemon serves.
PROBE = (json.dumps({"jsonrpc": "2.0", "id": PROBE_ID, "method": "daemon/status", "params": {}}) + "\n").encode()
PROBE_TIMEOUT_S = 10.0


def relay_declaration() -> bytes:
    """What the relay says of itself before its first request: it is memoryd's stdio relay,
    for the harness that is its parent. A notification (no answer to wait for), so a daemon
    that refuses the claim (the kernel does not bear it out) still serves the harness, as
    the relay's own process; one that predates it ignores the field."""
    return b'{"jsonrpc": "2.0", "method": "initialize", "params": {"relay": {"harnessPid": %d}}}\n' % os.getppid()

#: connect() errors that mean "no daemon there" (anything else, EACCES say, is reported).
NO_DAEMON = frozenset({errno.ENOENT, errno.ECONNREFUSED})


class RelayError(DaemonError):
    """Why the relay cannot attach; one line, printed as ``memoryd: <message>``."""


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        if exc.errno in NO_DAEMON:
            return None
        raise RelayError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    return sock


def _owner_socket(store: str) -> tuple[socket.socket, str] | None:
    """The daemon that already owns ``store``, by the socket its owner record names (next
    to the store), when that socket is in a private directory and answers."""
    record = read_owner_record(Path(store))
    if record is None or record.socket is None or not record.socket.startswith("/"):
        return None
    recorded = record.socket
    try:
        os.kill(record.pid, 0)  # a record left by a daemon that is gone means nothing
        check_private_dir(Path(recorded).parent)
    except (OSError, UnsafeDir):
        return None
    sock = _connect(recorded)
    return None if sock is None else (sock, recorded)


def attach(socket_path: str, serve_args: Sequence[str], db: str | None = None, *,
           follow_owner: bool = False) -> tuple[socket.socket, str, str | None]:
    """A connection to the daemon on ``socket_path``, started with ``serve_args`` when none
    answers; the socket it is on; and the store whose owner record found it, if one did.
    Never through a directory another user controls, who could have put their own socket there.

    ``follow_owner`` (nobody chose the socket): before starting a daemon, use one that owns
    the store on another socket. A host with a trimmed environment (no ``XDG_RUNTIME_DIR``)
    computes another default socket, where a second daemon would fail with STORE_LOCKED."""
    runtime = Path(socket_path).parent
    try:
        check_private_dir(runtime, missing_ok=True)
    except UnsafeDir as exc:
        raise RelayError(str(exc)) from None
    sock = _connect(socket_path)
    if sock is not None:
        return sock, socket_path, None
    if follow_owner:
        store = db if db is not None else str(default_db_path())
        found = _owner_socket(store)
        if found is not None:
            return found[0], found[1], store
    import signal

    from . import launch  # only when no daemon answers: subprocess and its kin cost start-up

    try:
        ensure_private_dir(runtime)
    except UnsafeDir as exc:
        raise RelayError(str(exc)) from None
    except OSError as exc:
        raise RelayError(f"cannot create the socket directory {runtime}: {exc.strerror or exc}") from None
    with launch.start_lock(runtime):
        sock = _connect(socket_path)  # another starter may have won the lock first
        if sock is None:
            log = log_path_for(Path(socket_path))
            try:
                # The harness giving up on this session (SIGTERM, SIGINT, SIGHUP) while the
                # daemon starts stops that daemon too, rather than leave it half-started.
                launch.spawn_ready(["--socket", str(socket_path), *serve_args], log=log,
                                   cancel_on=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
            except launch.LaunchFailed as exc:
                reason = str(exc).removeprefix("memoryd: ")  # the daemon's own line, already prefixed
                raise RelayError(f"could not start a daemon on {socket_path}: {reason} (log: {log})") from None
            sock = _connect(socket_path)
    if sock is None:
        raise RelayError(f"the daemon started on {socket_path} does not accept connections")
    return sock, socket_path, None


def _read_line(sock: socket.socket) -> tuple[bytes, bytes]:
    """The first line the daemon sends, and whatever came after it in the same reads."""
    buf = b""
    while b"\n" not in buf:
        data = sock.recv(CHUNK)
        if not data:
            raise RelayError("the daemon closed the connection before answering")
        buf += data
    line, _, rest = buf.partition(b"\n")
    return line, rest


def _ask(sock: socket.socket, socket_path: str, request: bytes, first: bytes = b"") -> tuple[bytes, bytes]:
    """Send the relay's own request (after ``first``, notifications that get no answer, in
    the same write) and read the daemon's first line: the answer, and what came after it in
    the same reads."""
    # Something that accepts but never answers must not hang the harness at spawn.
    sock.settimeout(PROBE_TIMEOUT_S)
    try:
        sock.sendall(first + request)
        return _read_line(sock)
    except TimeoutError:
        raise RelayError(f"the process on {socket_path} did not answer within {PROBE_TIMEOUT_S:g}s") from None
    except OSError as exc:  # reset or closed under us: it stopped, or it closed its listener
        raise RelayError(f"lost the connection to the daemon on {socket_path}: {exc.strerror or exc}") from None
    finally:
        sock.settimeout(None)


def check_store(sock: socket.socket, socket_path: str, db: str | None, write_policy: str | None, *,
                first: bytes = b"") -> bytes:
    """Ask the daemon what it serves before relaying anything (the reply is ours, not the
    harness's), ``first`` sent before the question; returns any bytes read past the reply."""
    line, rest = _ask(sock, socket_path, PROBE, first)
    try:
        status = json.loads(line)["result"]
    except (ValueError, KeyError, TypeError):
        raise RelayError(f"the process on {socket_path} does not answer as memoryd does") from None
    check_served(status, socket_path, db, write_policy)
    return rest


def check_served(status: Any, socket_path: str, db: str | None, write_policy: str | None) -> None:
    """Refuse a daemon that serves another store than ``db``, or another write policy:
    ``status`` is a ``daemon/status`` (or ``mcp/attach``) result."""
    try:
        served = str(Path(status["store"]["path"]))
    except (KeyError, TypeError):
        raise RelayError(f"the process on {socket_path} does not answer as memoryd does") from None
    if db is not None and not _same_file(served, db):
        raise RelayError(
            f"the daemon on {socket_path} serves the store {served}, not {db}; "
            f"give --socket of the daemon that serves {db}, or drop --db to use {served}"
        )
    served_policy = status.get("writePolicy")
    if write_policy is not None and served_policy is not None and served_policy != write_policy:
        raise RelayError(
            f"the daemon on {socket_path} runs write policy {served_policy!r}, not {write_policy!r}; "
            "the policy is the daemon's (its --write-policy or config), not the relay's"
        )


def _same_file(a: str, b: str) -> bool:
    """One store by any name: a symlink, a relative path or a hard link to it."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): then the names must agree
        return os.path.realpath(a) == os.path.realpath(b)


def _read(fd: int) -> bytes:
    """A chunk of stdin; the harness may have left its end O_NONBLOCK (EAGAIN is not EOF)."""
    while True:
        try:
            return os.read(fd, CHUNK)
        except BlockingIOError:
            select.select([fd], [], [])


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:  # an O_NONBLOCK stdout that is full: wait for the harness
            select.select([], [fd], [])
            continue
        view = view[n:]


def pump(sock: socket.socket, in_fd: int, out_fd: int, pending: bytes = b"") -> str | None:
    """Relay until the daemon closes. Returns ``None`` after a clean end (the harness
    closed stdin first, or stopped reading stdout), else the reason the daemon went."""
    stdin_done: list[bool] = []  # made true when the harness ended its input (not: our send failed)

    def upstream() -> None:
        try:
            while True:
                try:
                    data = _read(in_fd)
                except OSError:
                    data = b""  # stdin unreadable: as good as closed
                if not data:
                    stdin_done.append(True)
                    break
                sock.sendall(data)
        except OSError:
            pass  # the daemon went away: the downstream half reports it
        finally:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    # A thread of _thread's, as a daemon thread of threading's is: nothing joins it at exit.
    _thread.start_new_thread(upstream, ())
    try:
        if pending:
            _write_all(out_fd, pending)
        while True:
            try:
                data = sock.recv(CHUNK)
            except OSError as exc:
                return f"lost the connection to the daemon: {exc.strerror or exc}"
            if not data:
                return None if stdin_done else "the daemon closed the connection (it stopped)"
            _write_all(out_fd, data)
    except BrokenPipeError:
        return None  # the harness stopped reading: closing our socket ends its session
    finally:
        sock.close()


def _open_std_fds() -> None:
    """Open /dev/null on a closed fd 0, 1 or 2: else the daemon connection would take that
    number, and the relay would read it as stdin or write to it as stdout."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one


def _say(message: str) -> None:
    """One line on fd 2. Not print(): with fd 2 closed at start, sys.stderr is None."""
    try:
        _write_all(2, f"memoryd: {message}\n".encode())
    except OSError:
        pass


MCP_ATTACH_ID = "memoryd-mcp-attach"


def mcp_attach_line(cwd: str, agent: str | None) -> bytes:
    """The ``mcp/attach`` request ``memoryd mcp`` sends once the store is checked."""
    params: dict[str, Any] = {"cwd": cwd} if agent is None else {"cwd": cwd, "agent": agent}
    request = {"jsonrpc": "2.0", "id": MCP_ATTACH_ID, "method": "mcp/attach", "params": params}
    text = json.dumps(request, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        raise RelayError("the workspace path or agent name is not valid UTF-8; give --cwd and --agent "
                         "in UTF-8") from None


def switch_to_mcp(sock: socket.socket, socket_path: str, db: str | None, write_policy: str | None,
                  attach_line: bytes, *, first: bytes = b"") -> bytes:
    """Send ``mcp/attach`` (after ``first``) and check its answer, which says what the daemon
    serves as ``daemon/status`` does, before a byte of the host's is relayed. Returns the
    bytes read past the answer: MCP."""
    line, rest = _ask(sock, socket_path, attach_line, first)
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "result" not in answer:
        error = answer.get("error") if isinstance(answer, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if not isinstance(message, str):
            message = "it does not answer as a memoryd with MCP support does"
        raise RelayError(f"the daemon on {socket_path} refused the MCP session: {message}")
    check_served(answer["result"], socket_path, db, write_policy)
    return rest


def relay_stdio(socket_path: str, db: str | None, write_policy: str | None, serve_args: Sequence[str],
                mcp: tuple[str, str | None] | None = None, *, default_socket: bool = False) -> int:
    """Relay the harness's stdio to the daemon; the process's exit status. With ``mcp`` (``memoryd mcp``'s workspace and agent) the
    connection is switched to MCP first; ``default_socket``: nobody chose the socket
    (:func:`attach`'s ``follow_owner``)."""
    _open_std_fds()
    try:
        line = None if mcp is None else mcp_attach_line(*mcp)
        sock, attached, owned = attach(socket_path, serve_args, db, follow_owner=default_socket)
        if owned is not None:
            # found by the store's owner record: the daemon there must serve that store
            socket_path, db = attached, owned
        try:
            if line is None:
                rest = check_store(sock, socket_path, db, write_policy, first=relay_declaration())
            else:
                rest = switch_to_mcp(sock, socket_path, db, write_policy, line, first=relay_declaration())
        except BaseException:
            sock.close()
            raise
    except RelayError as exc:
        _say(str(exc))
        return 1
    # fd 1 carries protocol lines only: keep a private copy for them and point fd 1 at
    # stderr, so a stray print() cannot corrupt the stream.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    reason = pump(sock, 0, out_fd, rest)
    os.close(out_fd)
    if reason is not None:
        _say(f"{reason} ({socket_path})")
        return 1
    return 0
