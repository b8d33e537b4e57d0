"""The README is executable: every fenced block of README.md and docs/*.md marked runnable
runs, in document order, against a real daemon, in a sandbox of its own per document.

Marking a block: the word ``runnable`` after the language in the fence's info string.
GitHub highlights by the first word only, so the marker does not show::

    ```sh runnable        bash with ``set -euo pipefail``, on a pseudo-terminal
    ```console runnable   the ``$ `` lines run (with ``\\`` continuations and heredoc bodies);
                          every other line is sample output and is not compared
    ```python runnable    a complete script, run with the venv's python
    ```js runnable        an ES module, run with node in the working directory

A block without the marker is documentation only (installs, ``memoryd serve`` in the
foreground, ...). Shell blocks see memoryctl's approval prompt as a user does, and the runner
answers ``y`` to each ``Approve? [y/N]``; a block that needs other answers lists them in
order, ```` ```sh runnable answers=y,n ````, and must then ask exactly that many times. A
``sh`` block is pasted whole, and memoryctl discards type-ahead at its prompt, so in a ``sh``
block only the last command may ask: one that runs a further command after a prompt fails.

A document runs as in one terminal: each block is a fresh process, and the working
directory a shell block ends in is where the next block starts. The sandbox is a fresh short
directory under /tmp: HOME and TMPDIR inside it, XDG_RUNTIME_DIR, XDG_DATA_HOME,
XDG_CONFIG_HOME and MEMORYD_SOCKET unset (so the documented fallbacks are what runs), and
the venv's bin first on PATH. The first block starts where a reader is, at the root of a
checkout: a copy of this one (what git would commit: no ``.git``, nothing ``.gitignore``
names), which must hold exactly the same files, unchanged, once the document has run, since
no block may write into a reader's checkout. At the end every daemon the sandbox started is
stopped (SO_PEERCRED on its socket, SIGTERM, waited on with a pidfd), and any other process
it left behind fails the test.

The raw session transcript (```` ```ndjson transcript ````) is replayed against a daemon and
each line the daemon sends must carry at least the fields shown, with the values shown.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from processes import peer_pid, stop

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "runnable"
PROMPT = b"Approve? [y/N] "
BLOCK_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
LANGS = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "console", "shell-session": "console",
         "python": "python", "py": "python", "js": "js", "javascript": "js", "mjs": "js"}
TOOLS = ("bash", "node", "npm")

# --- extracting blocks (pure) ------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    info: tuple[str, ...]
    body: str

    @property
    def lang(self) -> str:
        return self.info[0].lower() if self.info else ""

    @property
    def runnable(self) -> bool:
        return MARKER in self.info[1:]

    @property
    def kind(self) -> str:
        """sh, console, python or js; raises for a runnable block of another language."""
        kind = LANGS.get(self.lang)
        if kind is None:
            raise ValueError(f"{self.where}: cannot run a ```{self.lang} block (known: {', '.join(LANGS)})")
        return kind

    @property
    def answers(self) -> list[str] | None:
        """The prompt answers the block declares (``answers=y,n``), or None for "y to each"."""
        for word in self.info[1:]:
            if word.startswith("answers="):
                return [a for a in word.removeprefix("answers=").split(",") if a]
        return None

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def blocks(text: str, doc: str = "<doc>") -> list[Block]:
    """The fenced code blocks of a markdown text, in order (CommonMark fences: ``` or ~~~,
    three or more, closed by a fence of the same character at least as long; indented
    fences, as inside list items, lose their indentation)."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        indent, fence, start = len(m["indent"]), m["fence"], i
        body: list[str] = []
        i += 1
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                break
            cut = min(indent, len(line) - len(line.lstrip(" \t")))
            body.append(line[cut:])
            i += 1
        out.append(Block(doc, start + 1, tuple(m["info"].split()), "\n".join(body) + "\n" if body else ""))
        i += 1
    return out


_HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def console_commands(body: str) -> str:
    """The shell script of a console transcript: its ``$ `` lines, with the lines a ``\\``
    continues onto and the bodies of the heredocs they open; the other lines are output."""
    lines = body.splitlines()
    script: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not (line.startswith("$ ") or line == "$"):
            continue
        command = [line[2:]]
        while command[-1].endswith("\\") and i < len(lines):
            command.append(lines[i])
            i += 1
        for dash, _quote, word in _HEREDOC.findall("\n".join(command)):
            while True:
                if i >= len(lines):
                    raise ValueError(f"the heredoc {word} is not closed")
                command.append(lines[i])
                i += 1
                if (command[-1].lstrip("\t") if dash else command[-1]) == word:
                    break
        script.extend(command)
    return "\n".join(script) + "\n" if script else ""


def runnable_blocks(path: Path) -> list[Block]:
    return [b for b in blocks(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))) if b.runnable]


# --- the sandbox ---------------------------------------------------------------------------


@dataclass
class Sandbox:
    root: Path
    env: dict[str, str]
    cwd: Path
    transcript: list[str] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def runner(self) -> Path:
        return self.root / "runner"

    @property
    def socket_path(self) -> Path:
        """Where memoryctl, the relay and the clients look without XDG_RUNTIME_DIR."""
        return self.root / "tmp" / f"memoryd-{os.getuid()}" / "memoryd.sock"


def _sandbox_env(home: Path, tmp: Path) -> dict[str, str]:
    drop = ("XDG_", "MEMORYD_", "npm_config_", "LISTEN_", "NOTIFY_SOCKET", "PYTEST_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    venv_bin = Path(sys.executable).parent
    env.update(
        HOME=str(home), TMPDIR=str(tmp), TERM="dumb",
        PATH=os.pathsep.join([str(venv_bin), *[p for p in env.get("PATH", "").split(os.pathsep) if p]]),
        # npm stays offline: nothing to audit, fund or update-check in a local install
        npm_config_audit="false", npm_config_fund="false", npm_config_update_notifier="false",
    )
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    return env


def _copy_file(src: str, dst: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # removed meanwhile (an editor's temporary file)
        shutil.copy2(src, dst)


def copy_checkout(dest: Path) -> None:
    """The checkout as a reader has it, without what git would not commit: ``.git`` and the
    names ``.gitignore`` lists (the venv, caches, node_modules: the test's, not the reader's)."""
    patterns = [line.strip().rstrip("/").rsplit("/", 1)[-1]
                for line in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith(("#", "!"))]
    shutil.copytree(ROOT, dest, symlinks=True, ignore=shutil.ignore_patterns(".git", *patterns),
                    copy_function=_copy_file)


def files_of(top: Path) -> dict[str, str]:
    """Every directory, file and link under ``top`` by relative path, with what it holds (a
    file's digest, a link's target): a checkout's state, to compare before and after."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = here / name
            rel = str(path.relative_to(top))
            if path.is_symlink():
                found[rel] = f"a link to {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "a directory"
            else:
                found[rel] = "a file, sha256 " + hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs between two :func:`files_of` states, one line per path."""
    return ([f"added {p} ({after[p]})" for p in sorted(after.keys() - before.keys())]
            + [f"removed {p}" for p in sorted(before.keys() - after.keys())]
            + [f"changed {p} (now {after[p]})" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]])


@contextlib.contextmanager
def sandbox() -> Iterator[Sandbox]:
    root = Path(tempfile.mkdtemp(prefix="rd-", dir="/tmp"))
    try:
        for sub in ("home", "tmp", "runner"):
            (root / sub).mkdir(mode=0o700)
        work = root / "home" / "work"
        copy_checkout(work)
        sb = Sandbox(root, _sandbox_env(root / "home", root / "tmp"), work)
        assert len(os.fsencode(sb.socket_path)) <= 107, sb.socket_path
        try:
            yield sb
        finally:
            clean_up(sb)  # a failed test leaves nothing running either
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- running blocks ------------------------------------------------------------------------


class BlockFailed(AssertionError):
    pass


def _fail(block: Block, what: str, output: str) -> BlockFailed:
    return BlockFailed(f"{block.where} (```{' '.join(block.info)}) {what}\n--- output ---\n{output[-6000:]}")


def _controlling_tty() -> None:  # in the child, after setsid: the pty becomes its terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def run_on_pty(argv: list[str], *, cwd: Path, env: dict[str, str], answers: list[str] | None,
               timeout: float = BLOCK_TIMEOUT_S) -> tuple[int, str, int]:
    """Run ``argv`` with a new pseudo-terminal as its controlling terminal and stdio;
    answer each approval prompt the moment it appears. Returns (exit status, output,
    prompts answered). Waits only on the terminal's output and the process's exit."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env,
                                start_new_session=True, preexec_fn=_controlling_tty)
    finally:
        os.close(slave)
    out = bytearray()
    asked = 0
    pidfd = os.pidfd_open(proc.pid)
    try:
        deadline = time.monotonic() + timeout
        reading = True
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([pidfd, *([master] if reading else [])], [], [], max(left, 0))
            if not ready:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise TimeoutError(f"still running after {timeout:g}s\n{out.decode(errors='replace')}")
            if master in ready:
                chunk = _read(master)
                if chunk is None:
                    reading = False  # every copy of the terminal is closed
                else:
                    out += chunk
                    # a prompt waits at the end of the output (an echoed command that
                    # merely contains the words is not one)
                    if out.endswith(PROMPT):
                        if answers is not None and asked >= len(answers):
                            os.killpg(proc.pid, signal.SIGKILL)
                            proc.wait()
                            raise ValueError(f"prompt {asked + 1} but only answers={','.join(answers)}\n"
                                             f"{out.decode(errors='replace')}")
                        os.write(master, f"{answers[asked] if answers is not None else 'y'}\n".encode())
                        asked += 1
            if pidfd in ready:
                break
        code = proc.wait()
        os.set_blocking(master, False)
        while (chunk := _read(master)) is not None:  # what it wrote just before it exited
            out += chunk
        return code, out.decode(errors="replace").replace("\r\n", "\n"), asked
    finally:
        os.close(pidfd)
        os.close(master)


def _read(fd: int) -> bytes | None:
    """A chunk, or None at end of output (EIO once the last slave is closed) or when a
    non-blocking read finds nothing."""
    try:
        return os.read(fd, 65536) or None
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno == errno.EIO:
            return None
        raise


def run_block(sb: Sandbox, block: Block, index: int) -> None:
    kind = block.kind
    if kind in ("sh", "console"):
        body = block.body if kind == "sh" else console_commands(block.body)
        state = sb.runner / "cwd"
        script = sb.runner / f"block-{index}.sh"
        script.write_text(f"trap 'pwd > {_quote(state)}' EXIT\nset -euo pipefail\nset -v\n{body}")
        bash = shutil.which("bash")
        assert bash is not None
        try:
            code, output, asked = run_on_pty([bash, "--noprofile", "--norc", str(script)], cwd=sb.cwd,
                                             env=sb.env, answers=block.answers)
        except (TimeoutError, ValueError) as exc:
            raise _fail(block, str(exc).split("\n", 1)[0], str(exc).split("\n", 1)[-1]) from None
        sb.transcript.append(f"## {block.where}\n{output}")
        if code != 0:
            raise _fail(block, f"exited with status {code}", output)
        if block.answers is not None and asked != len(block.answers):
            raise _fail(block, f"asked {asked} times, but declares answers={','.join(block.answers)}", output)
        late = read_after_prompt(body, output) if kind == "sh" and asked else None
        if late is not None:
            raise _fail(block, f"goes on after its prompt, with {late!r}: a reader pasting it would lose that "
                        "(memoryctl discards type-ahead at the prompt); end the block at the prompt", output)
        sb.cwd = Path(state.read_text().strip())
        return
    if kind == "python":
        script = sb.runner / f"block-{index}.py"
        script.write_text(block.body)
        argv, stdin = [sys.executable, str(script)], None
    else:
        node = shutil.which("node", path=sb.env["PATH"])
        assert node is not None
        argv, stdin = [node, "--input-type=module", "-"], block.body
    try:
        r = subprocess.run(argv, input=stdin, cwd=sb.cwd, env=sb.env, stdin=None if stdin else subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT_S,
                           start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise _fail(block, f"still running after {BLOCK_TIMEOUT_S:g}s", str(exc.output or "")) from None
    sb.transcript.append(f"## {block.where}\n{r.stdout}")
    if r.returncode != 0:
        raise _fail(block, f"exited with status {r.returncode}", r.stdout)


def read_after_prompt(body: str, output: str) -> str | None:
    """The first line of a shell block that bash read after the block's last prompt (``set
    -v`` echoes each line as it is read), or None when the block ends at the prompt."""
    tail = set(output.rpartition(PROMPT.decode())[2].splitlines())
    for line in body.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and line in tail:
            return line
    return None


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


# --- cleaning up ---------------------------------------------------------------------------


def processes_of(home: Path) -> dict[int, str]:
    """Live processes whose environment has ``HOME=<home>``: everything the sandbox started."""
    needle = f"HOME={home}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def daemon_store(sb: Sandbox) -> str | None:
    """The store path the sandbox's daemon serves, or None when none answers."""
    if peer_pid(sb.socket_path) is None:
        return None
    import memoryd_client as mc

    with mc.connect_sync(sb.socket_path, timeout=30) as c:
        return str(c.status().store.path)


def clean_up(sb: Sandbox) -> list[str]:
    """Stop the sandbox's daemon, then anything else it left running; the problems found."""
    problems: list[str] = []
    pid = peer_pid(sb.socket_path)
    if pid is not None and not stop(pid, STOP_TIMEOUT_S):
        problems.append(f"the daemon (pid {pid}) did not exit within {STOP_TIMEOUT_S:g}s of SIGTERM")
    for pid, cmdline in processes_of(sb.home).items():
        problems.append(f"left running: pid {pid}: {cmdline}")
        stop(pid)
    return problems


def left_behind(sb: Sandbox) -> list[str]:
    """What is left in the sandbox besides the user's own things (the checkout, the demo
    project, the memory backup the README has them keep, npm's cache) and the runner's:
    after an uninstall, nothing may be."""
    own = {sb.runner, sb.home / "work", sb.home / "proj", sb.home / "memory-backup.json", sb.home / ".npm"}
    left: list[str] = []
    for dirpath, dirnames, filenames in os.walk(sb.root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in own]
        left += [str(here / f) for f in filenames if here / f not in own]
        left += [str(here / d) for d in dirnames if d.startswith("memoryd")]
    return sorted(left)


# --- the tests -----------------------------------------------------------------------------

RUNNABLE = {str(p.relative_to(ROOT)): p for p in DOCS if runnable_blocks(p)}
#: Documents whose runnable blocks end with the uninstall: memoryd's files must all be gone.
UNINSTALLS = {"README.md"}


def _need_tools() -> None:
    """A block that cannot run is a failure, never a skip: a skipped README proves nothing."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(f"the runnable docs need {', '.join(missing)} (the test run installs them when run "
                    "as root: tests/system_tools.py)")


@pytest.mark.parametrize("doc", sorted(RUNNABLE))
def test_runnable_blocks_run(doc: str) -> None:
    _need_tools()
    if not (Path(sys.executable).parent / "memoryctl").exists():
        pytest.fail(f"memoryctl is not installed next to {sys.executable} (pip install -e .)")
    with sandbox() as sb:
        checkout = sb.cwd
        before = files_of(checkout)
        problems: list[str] = []
        try:
            for index, block in enumerate(runnable_blocks(RUNNABLE[doc])):
                run_block(sb, block, index)
            problems += [f"the blocks changed the reader's checkout: {change}"
                         for change in changes(before, files_of(checkout))]
            store = daemon_store(sb)
            if store is not None and not store.startswith(f"{sb.home}/"):
                problems.append(f"the daemon serves {store}, outside the sandbox's HOME {sb.home}")
            if doc in UNINSTALLS:
                if store is not None:
                    problems.append(f"the uninstall left the daemon running on {sb.socket_path}")
                problems += [f"the uninstall left {path}" for path in left_behind(sb)]
        finally:
            problems += clean_up(sb)
        assert not problems, "\n".join(problems) + "\n" + "\n".join(sb.transcript)[-6000:]


def test_the_readme_runs_every_kind_of_block() -> None:
    """The extractor cannot quietly find nothing: the README has runnable blocks of every kind."""
    kinds = {b.kind for b in runnable_blocks(ROOT / "README.md")}
    assert kinds == {"sh", "console", "python", "js"}


def test_the_sandbox_starts_in_a_copy_of_the_checkout_and_sees_what_changed_in_it() -> None:
    """The checkout comparison is real: the copy holds the reader's files (not git's or the
    test run's), and a file added, changed or removed in it is named."""
    with sandbox() as sb:
        before = files_of(sb.cwd)
        assert before.keys() >= {"README.md", "client/js/package.json", ".ci/run"}
        assert not [p for p in before if p.split("/")[0] in (".git", ".venv", "node_modules") or "__pycache__" in p]
        (sb.cwd / "package.json").write_text("{}\n")
        (sb.cwd / "README.md").write_text("changed\n")
        (sb.cwd / "pyproject.toml").unlink()
        assert changes(before, files_of(sb.cwd)) == [
            "added package.json (a file, sha256 " + hashlib.sha256(b"{}\n").hexdigest() + ")",
            "removed pyproject.toml",
            "changed README.md (now a file, sha256 " + hashlib.sha256(b"changed\n").hexdigest() + ")"]
        assert clean_up(sb) == []


def test_every_runnable_block_has_a_known_language() -> None:
    for path in DOCS:
        for b in runnable_blocks(path):
            assert b.kind in ("sh", "console", "python", "js"), b.where


# --- the extractor's own rules (pure) ------------------------------------------------------


def test_blocks_reads_info_words_indentation_and_fences() -> None:
    text = "\n".join([
        "intro",
        "```sh runnable answers=y,n",
        "echo hi",
        "```",
        "- item",
        "  ```console",
        "  $ ls",
        "    indented output",
        "  ```",
        "~~~~python runnable",
        "```",
        "print(1)",
        "~~~~",
        "````",
        "```js runnable",
        "````",
        "``` runnable",
        "```",
    ])
    got = blocks(text, "d.md")
    assert [(b.line, b.info, b.body) for b in got] == [
        (2, ("sh", "runnable", "answers=y,n"), "echo hi\n"),
        (6, ("console",), "$ ls\n  indented output\n"),
        (10, ("python", "runnable"), "```\nprint(1)\n"),
        (14, (), "```js runnable\n"),
        (17, ("runnable",), ""),
    ]
    assert [b.runnable for b in got] == [True, False, True, False, False]
    assert got[0].answers == ["y", "n"] and got[2].answers is None
    assert got[0].kind == "sh" and got[2].kind == "python"


def test_a_runnable_block_of_an_unknown_language_is_an_error() -> None:
    (b,) = blocks("```toml runnable\nx = 1\n```\n", "d.md")
    with pytest.raises(ValueError, match=r"d.md:1: cannot run a ```toml block"):
        _ = b.kind


def test_console_commands_keeps_commands_continuations_and_heredocs() -> None:
    body = "\n".join([
        "$ memoryctl status       # comment",
        "socket  /x",
        "$ memoryctl add --track user \\",
        "    --scope user-global x",
        "Approve? [y/N] y",
        "$ cat > f <<'EOF'",
        "$ not a command",
        "EOF",
        "$ cat <<-END && cat <<<here",
        "\tbody",
        "\tEND",
        "added 1234",
        "$",
    ])
    assert console_commands(body) == "\n".join([
        "memoryctl status       # comment",
        "memoryctl add --track user \\",
        "    --scope user-global x",
        "cat > f <<'EOF'",
        "$ not a command",
        "EOF",
        "cat <<-END && cat <<<here",
        "\tbody",
        "\tEND",
        "",
    ]) + "\n"
    with pytest.raises(ValueError, match="heredoc EOF is not closed"):
        console_commands("$ cat <<EOF\nx\n")


# --- the captured session transcript -------------------------------------------------------

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_TIMES = frozenset({"createdAt", "updatedAt"})
#: approval/asked's origin: the asking process, which is another one on every machine
_PROCESS = frozenset({"pid", "exe"})


def _volatile(key: str | None, value: Any) -> bool:
    """Ids, clock readings and process facts: bound to what the daemon sends, not compared
    literally."""
    return (isinstance(value, str) and _UUID.match(value) is not None) or (
        key in _TIMES and isinstance(value, int) and not isinstance(value, bool)) or key in _PROCESS


def shown_in(shown: Any, sent: Any, bound: dict[Any, Any], key: str | None = None, at: str = "") -> list[str]:
    """Where ``sent`` differs from what ``shown`` shows: the whole message, every field shown
    sent with the value shown and every field sent shown (a field the daemon adds must be
    added to the README too). A volatile value binds to the sent one at first sight and must
    be the same wherever it recurs."""
    if _volatile(key, shown):
        if shown not in bound:
            bound[shown] = sent
        return [] if bound[shown] == sent else [f"{at}: {sent!r}, where {shown!r} was {bound[shown]!r} before"]
    if isinstance(shown, dict):
        if not isinstance(sent, dict):
            return [f"{at}: {sent!r}, not an object"]
        out: list[str] = []
        for k, v in shown.items():
            out += shown_in(v, sent[k], bound, k, f"{at}.{k}") if k in sent else [f"{at}.{k}: missing"]
        return out + [f"{at}.{k}: sent, not shown" for k in sent if k not in shown]
    if isinstance(shown, list):
        if not isinstance(sent, list) or len(sent) != len(shown):
            return [f"{at}: {sent!r}, not a list of {len(shown)}"]
        return [d for i, (a, b) in enumerate(zip(shown, sent, strict=True)) for d in shown_in(a, b, bound, key, f"{at}[{i}]")]
    return [] if shown == sent and type(shown) is type(sent) else [f"{at}: {sent!r}, shown as {shown!r}"]


def _bind(value: Any, bound: dict[Any, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _bind(v, bound) for k, v in value.items()}
    if isinstance(value, list):
        return [_bind(v, bound) for v in value]
    return bound.get(value, value) if isinstance(value, str) else value


def transcript(path: Path) -> list[tuple[str, Any]]:
    (block,) = [b for b in blocks(path.read_text(encoding="utf-8"), path.name) if b.info == ("ndjson", "transcript")]
    lines = [ln for ln in block.body.splitlines() if ln.strip()]
    assert all(ln[:2] in ("→ ", "← ") for ln in lines), block.where
    return [(ln[0], json.loads(ln[2:])) for ln in lines]


def test_the_session_transcript_is_what_the_daemon_says(ask_daemon: Any) -> None:
    """README's raw NDJSON session, replayed: each burst of ← lines after a → line is what
    the daemon sends then (in any order within the burst), field for field as shown."""
    steps = transcript(ROOT / "README.md")
    bound: dict[Any, Any] = {}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(ask_daemon.socket_path))
        reader = s.makefile("rb")
        i = 0
        while i < len(steps):
            direction, message = steps[i]
            assert direction == "→", f"line {i + 1}: the daemon speaks first?"
            s.sendall(json.dumps(_bind(message, bound)).encode() + b"\n")
            i += 1
            burst = []
            while i < len(steps) and steps[i][0] == "←":
                burst.append(steps[i][1])
                i += 1
            received = [json.loads(reader.readline()) for _ in burst]
            for shown in burst:
                fits = [m for m in received if not shown_in(shown, m, dict(bound))]
                assert fits, f"not sent: {json.dumps(shown)}\nsent: " + "\n".join(
                    f"{json.dumps(m)}\n  {shown_in(shown, m, dict(bound))}" for m in received)
                assert not shown_in(shown, fits[0], bound)  # now bind its ids
                received.remove(fits[0])


def test_shown_in_binds_ids_and_compares_the_whole_message() -> None:
    uid, other = "04d6d6f0-1bd2-42fe-b362-deebb983fddb", "2ed1a288-57fb-4beb-8414-a445209af550"
    bound: dict[Any, Any] = {}
    assert shown_in({"id": uid, "a": [1, {"createdAt": 5}]}, {"id": other, "a": [1, {"createdAt": 9}]}, bound) == []
    assert bound == {uid: other, 5: 9}
    assert shown_in({"a": [{"b": 1}]}, {"a": [{"b": 1, "new": True}], "extra": 1}, {}) == [
        ".a[0].new: sent, not shown", ".extra: sent, not shown"]
    assert shown_in({"id": uid}, {"id": uid}, bound) == [f".id: {uid!r}, where {uid!r} was {other!r} before"]
    assert shown_in({"a": 1, "b": [1]}, {"a": True, "b": [1, 2]}, {}) == [
        ".a: True, shown as 1", ".b: [1, 2], not a list of 1"]
    assert shown_in({"gone": 1}, {}, {}) == [".gone: missing"]
    assert _bind({"params": {"id": uid}}, bound) == {"params": {"id": other}}


# --- the runner's own behaviour (no daemon) ------------------------------------------------


@pytest.fixture
def sb() -> Iterator[Sandbox]:
    with sandbox() as box:
        yield box
        assert clean_up(box) == []


def _blocks(text: str) -> list[Block]:
    return [b for b in blocks(text, "t.md") if b.runnable]


def test_runner_answers_prompts_on_a_terminal_and_keeps_the_cwd(sb: Sandbox) -> None:
    doc = "\n".join([
        "```sh runnable",
        "test -t 0 && test -t 1 && test -t 2      # a terminal, as for a user",
        "test -z \"${XDG_RUNTIME_DIR:-}${XDG_DATA_HOME:-}${XDG_CONFIG_HOME:-}${MEMORYD_SOCKET:-}\"",
        "test \"$HOME\" = \"$(cd ~ && pwd)\" && test \"$(command -v memoryctl)\" = \"$(dirname \"$(command -v python)\")/memoryctl\"",
        "mkdir -p sub && cd sub",
        "for i in 1 2; do printf 'Approve? [y/N] '; read -r a; echo \"got $a\"; done",
        "```",
        "```console runnable answers=n",
        "$ printf 'Approve? [y/N] ' >&2; read -r a; echo \"then $a\" > answer",
        "this line is output",
        "```",
        "```python runnable",
        "import os",
        "print('py in', os.getcwd(), open('answer').read().strip())",
        "```",
    ])
    for index, block in enumerate(_blocks(doc)):
        run_block(sb, block, index)
    assert sb.cwd == sb.home / "work" / "sub"
    out = "\n".join(sb.transcript)
    assert "Approve? [y/N] y\ngot y\n" in out and out.count("got y") == 2
    assert f"py in {sb.home}/work/sub then n" in out


@pytest.mark.parametrize("doc, error", [
    ("```sh runnable\ntrue\nfalse\necho never\n```", r"t.md:1 \(```sh runnable\) exited with status 1"),
    ("```sh runnable\necho a | false | true\n```", "exited with status 1"),  # pipefail
    ("```sh runnable\necho $UNSET_VARIABLE\n```", "exited with status 1"),  # nounset
    ("```console runnable\n$ false\n```", "exited with status 1"),
    ("```python runnable\nraise SystemExit(3)\n```", "exited with status 3"),
    ("```js runnable\nprocess.exit(4);\n```", "exited with status 4"),
    ("```sh runnable answers=y\necho no prompt\n```", "asked 0 times, but declares answers=y"),
    ("```sh runnable answers=y\nprintf 'Approve? [y/N] '; read a; printf 'Approve? [y/N] '; read a\n```",
     "prompt 2 but only answers=y"),
    ("```sh runnable\nprintf 'Approve? [y/N] '; read -r a\necho \"pasted, then lost\"\n```",
     r"goes on after its prompt, with 'echo \"pasted, then lost\"'"),
])
def test_runner_fails_the_block_that_fails(sb: Sandbox, doc: str, error: str) -> None:
    (block,) = _blocks(doc)
    with pytest.raises(BlockFailed, match=error):
        run_block(sb, block, 0)


def test_clean_up_stops_what_a_block_left_running() -> None:
    with sandbox() as box:
        # HUP ignored from the start: the terminal's hangup when bash exits must not end it.
        # The stray is a fork of bash that runs no program (a builtin read on a FIFO nobody
        # writes): a forked program is found by its environment only once its exec is done.
        (block,) = _blocks("```sh runnable\ntrap '' HUP\nmkfifo \"$HOME/never\"\n"
                           "( exec 3<>\"$HOME/never\"; read -r -u 3 _ ) > /dev/null 2>&1 &\n```")
        run_block(box, block, 0)
        (stray,) = processes_of(box.home)
        problems = clean_up(box)
        assert len(problems) == 1 and problems[0].startswith(f"left running: pid {stray}: ")
        assert processes_of(box.home) == {}
