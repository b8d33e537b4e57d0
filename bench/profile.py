"""py-spy profiles of a running daemon under a load (``python -m bench --profile``).

Each load runs three times under ``py-spy record``: for a flame graph (SVG) of every thread
that is not idle, then for the same samples as collapsed stacks (``.txt``), then for the
thread holding the GIL only (``--gil``, ``.gil.txt``). :func:`top` summarizes a ``.txt``:

    python -m bench.profile bench/results/profile-writes.txt [N]
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from .common import BIN


def py_spy() -> str | None:
    here = BIN / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


class Profiler:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.exe = py_spy()
        if self.exe is None:
            print("[bench] py-spy is not installed (pip install py-spy): no profiles", file=sys.stderr, flush=True)

    def __call__(self, label: str, pid: int, load: Callable[[], object]) -> None:
        if self.exe is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        for fmt, ext, extra in (("flamegraph", "svg", []), ("raw", "txt", []), ("raw", "gil.txt", ["--gil"])):
            path = self.out / f"profile-{label}.{ext}"
            spy = subprocess.Popen([self.exe, "record", "--pid", str(pid), "--rate", "200", "--format", fmt, *extra,
                                    "-o", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert spy.stdout
            first = spy.stdout.readline()  # "py-spy> Sampling process ..." once it is attached
            if b"Sampling" not in first:
                _, err = spy.communicate()
                print(f"[bench] py-spy failed: {(first + err).decode(errors='replace').strip()}", file=sys.stderr)
                return
            try:
                load()
            finally:
                spy.send_signal(signal.SIGINT)
                spy.communicate()
            print(f"[bench] wrote {path}", file=sys.stderr, flush=True)


_LINE = re.compile(r":\d+\)$")
#: Frames that every sample of a thread sits under: the interpreter's, the event loop's and
#: the threads' roots, and memoryd's entry points.
_ROOTS = re.compile(r"\((<frozen runpy>|asyncio/(base_events|runners|events)\.py|threading\.py|memoryd/(__main__|cli)\.py)\)$"
                    r"|^(run|AsyncIOBackend\.run) \(anyio/|^serve \(memoryd/app\.py\)$")


def top(path: Path, n: int = 12) -> str:
    """The functions (their lines merged) with the most samples: by self time, and by
    inclusive time leaving out the roots (``_ROOTS``)."""
    self_: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        total += k
        frames = [_LINE.sub(")", f) for f in stack.split(";")]
        self_[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    rows = [f"{total} samples", "", "self:"]
    rows += [f"  {c / total:6.1%}  {f}" for f, c in self_.most_common(n)]
    rows += ["", "inclusive (below the roots):"]
    rows += [f"  {c / total:6.1%}  {f}" for f, c in [(f, c) for f, c in incl.most_common() if not _ROOTS.search(f)][:n]]
    return "\n".join(rows)


if __name__ == "__main__":
    print(top(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 12))
