"""Crash soak: many kill -9 trials against real daemons (issue 8, item 10).

    python -m bench.soak [--trials 200] [--base-seed 1] [--seed S]

Each trial is tests/faults.py's :func:`run_trial`: several clients send bursts of mixed
writes, the daemon is SIGKILLed at a seeded moment, the store is checked offline (integrity,
every acknowledged write present, every write without a reply applied whole or not at all,
nothing else), and a daemon restarted on it must serve it. Trial ``n`` has the seed
``trial_seed(base, n)``; ``--seed`` reruns one. Prints one summary line and exits 1 on any
failure (each failure is printed with its seed; its store and logs are kept).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from faults import TrialFailed, run_trial, trial_seed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200, help="how many trials (default 200)")
    ap.add_argument("--base-seed", type=int, default=1,
                    help="trial n has the seed trial_seed(base, n) (default 1; CI's trials use 8)")
    ap.add_argument("--seed", type=int, action="append", default=[], help="run only this seed (repeatable)")
    args = ap.parse_args(argv)
    seeds = args.seed or [trial_seed(args.base_seed, n) for n in range(args.trials)]
    started = time.monotonic()
    acked: Counter[str] = Counter()
    unanswered: Counter[str] = Counter()
    failures: list[str] = []
    for seed in seeds:
        try:
            result = run_trial(seed)
        except TrialFailed as exc:
            failures.append(str(exc))
            print(f"FAIL {exc}", file=sys.stderr, flush=True)
            continue
        acked.update(result.acked)
        unanswered.update(result.unanswered)
    by_method = ", ".join(f"{m.removeprefix('memory/')} {n}" for m, n in sorted(acked.items()))
    print(f"crash soak: {len(seeds)} trials, {sum(acked.values())} acknowledged writes checked ({by_method}), "
          f"{sum(unanswered.values())} unanswered at the kill ({unanswered['applied']} applied whole, "
          f"{unanswered['not applied']} not at all), {len(failures)} failures, "
          f"{time.monotonic() - started:.1f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
