"""Asking a human at a terminal to approve a write (``memoryctl``'s approval handler).

The prompt is read from stdin when it is a terminal, else from ``/dev/tty``; with neither,
nobody can be asked and the write is denied (fail closed). Reading is async
(``anyio.wait_readable``), so a prompt can be abandoned cleanly when another approver
decides first. Type-ahead is flushed before each prompt so a stray ``y`` typed earlier
cannot approve a write the human has not seen.
"""

from __future__ import annotations

import os
import sys
import termios

import anyio
from memoryd_protocol import types as T
from memoryd_protocol.constants import ALLOWED_ONCE

from . import colour, render
from .approvals import Decision

#: ``approval/decided``'s ``by`` for each way memoryctl decides
HUMAN = T.ApprovalBy(kind="human")
YES_FLAG = T.ApprovalBy(kind="script", name="memoryctl --yes")
REJECT_FLAG = T.ApprovalBy(kind="script", name="memoryctl --reject")
NO_TERMINAL = T.ApprovalBy(kind="policy", name="memoryctl: no terminal, fail closed")
INPUT_CLOSED = T.ApprovalBy(kind="policy", name="memoryctl: input closed, fail closed")

YES = frozenset({"y", "yes"})
NO_TTY_NOTICE = (
    "memoryctl: no terminal to ask for approval; denying (fail closed). "
    "Pass --yes to approve without asking, or --via-approver to let a running 'memoryctl approve' decide."
)


class Terminal:
    """A line-oriented conversation with the user's terminal."""

    def __init__(self, fd: int, *, owned: bool) -> None:
        self.fd = fd
        self._owned = owned

    @classmethod
    def open(cls) -> Terminal | None:
        """stdin if it is a terminal (prompt on stderr), else /dev/tty, else None."""
        try:
            if sys.stdin is not None and sys.stdin.isatty():
                return cls(sys.stdin.fileno(), owned=False)
        except (ValueError, OSError):
            pass
        try:
            fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        except OSError:
            return None
        return cls(fd, owned=True)

    def write(self, text: str) -> None:
        if self._owned:
            data = text.encode("utf-8", "replace")
            while data:
                data = data[os.write(self.fd, data) :]
        else:
            sys.stderr.write(text)
            sys.stderr.flush()

    def painter(self) -> colour.Paint:
        """The colour painter for what :meth:`write` writes (stderr, or the terminal)."""
        return colour.painter(self.fd if self._owned else sys.stderr)

    def columns(self) -> int:
        """The terminal's width (80 when it does not say)."""
        try:
            return os.get_terminal_size(self.fd).columns or 80
        except OSError:
            return 80

    def flush_input(self) -> None:
        try:
            termios.tcflush(self.fd, termios.TCIFLUSH)
        except (termios.error, OSError):
            pass

    async def readline(self) -> str | None:
        """One line (without its newline), or None at end of input (Ctrl-D)."""
        buffer = b""
        while True:
            await anyio.wait_readable(self.fd)
            try:
                chunk = os.read(self.fd, 1024)
            except BlockingIOError:
                continue
            except OSError:  # EIO: the terminal went away
                return None
            if not chunk:
                return buffer.decode("utf-8", "replace") if buffer else None
            buffer += chunk
            if b"\n" in buffer:
                return buffer.split(b"\n", 1)[0].decode("utf-8", "replace")

    def close(self) -> None:
        if self._owned:
            os.close(self.fd)
            self._owned = False


class Approver:
    """``on_approval`` handler: shows the complete payload and asks ``Approve? [y/N]``.

    ``yes`` approves and ``reject`` rejects without asking (both still show the payload on
    stderr); with no terminal the answer is ``rejected``. Prompts run one at a time. Each
    answer says who gave it (``approval/decided``'s ``by``): ``script`` for ``--yes`` and
    ``--reject``, ``human`` for an answer typed at the prompt, ``policy`` when memoryctl
    fails closed (no terminal, input closed).
    """

    def __init__(self, *, yes: bool = False, reject: bool = False) -> None:
        self.yes = yes
        self.reject = reject
        self.eof = False
        self.asked = 0
        #: the times a human typed no at this prompt (memoryctl share goes on after one)
        self.declined = 0
        #: the approval shown at the prompt, waiting for an answer (None between prompts)
        self.prompting: str | None = None
        #: set on Ctrl-C in memoryctl approve, which then says what becomes of ``prompting``
        self.stopping = False
        self._lock = anyio.Lock()
        self._terminal: Terminal | None = None
        self._opened = False

    def _term(self) -> Terminal | None:
        if not self._opened:
            self._opened = True
            self._terminal = Terminal.open()
        return self._terminal

    async def __call__(self, asked: T.ApprovalAsked) -> Decision:
        async with self._lock:
            self.asked += 1
            request = render.approval_request(asked, paint=colour.painter(sys.stderr))
            if self.eof:
                _say(f"{request}\nmemoryctl: input closed; rejecting")
                return Decision("rejected", INPUT_CLOSED)
            if self.reject:
                _say(f"{request}\nmemoryctl: rejected (--reject)")
                return Decision("rejected", REJECT_FLAG)
            if self.yes:
                _say(f"{request}\nmemoryctl: approved (--yes)")
                return Decision(ALLOWED_ONCE, YES_FLAG)
            term = self._term()
            if term is None:
                _say(f"{request}\n{NO_TTY_NOTICE}")
                return Decision("rejected", NO_TERMINAL)
            term.flush_input()
            # Cut to the terminal's width: a long line that wrapped by itself could show a
            # piece of memory text at the start of a line, outside the gutter.
            request = render.approval_request(asked, width=term.columns(), paint=term.painter())
            term.write(f"{request}\nApprove? [y/N] ")
            self.prompting = asked.id  # no await since the write: Ctrl-C cannot fall between them
            try:
                answer = await term.readline()
            except anyio.get_cancelled_exc_class():
                if not self.stopping:  # decided elsewhere; on Ctrl-C the approve verb says what happens
                    term.write("\n(this approval is no longer pending)\n")
                raise
            finally:
                self.prompting = None
            if answer is None:
                self.eof = True
                term.write("\n")
                return Decision("rejected", INPUT_CLOSED)
            if answer.strip().lower() in YES:
                return Decision(ALLOWED_ONCE, HUMAN)
            self.declined += 1
            return Decision("rejected", HUMAN)

    def close(self) -> None:
        if self._terminal is not None:
            self._terminal.close()


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


__all__ = ["NO_TTY_NOTICE", "Approver", "Terminal"]
