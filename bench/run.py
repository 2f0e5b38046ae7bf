"""`python -m bench.run NAME [ARG]` runs one benchmark; `python -m bench.run all` runs each."""

from __future__ import annotations

import subprocess
import sys

NAMES = [
    "submit_latency",
    "dev_latency",
    "throughput",
    "concurrency",
    "event_latency",
    "crash_recovery",
    "polling_cost",
    "stream_fanout",
    "stream_output",
    "cancel_latency",
    "workflow_cost",
    "shape",
    "sandbox",
    "structured_output",
]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in [*NAMES, "all"]:
        print(f"usage: python -m bench.run {{{'|'.join(NAMES)}|all}} [ARG]", file=sys.stderr)
        return 2
    names = NAMES if argv[0] == "all" else [argv[0]]
    failed = 0
    for name in names:
        # One process per benchmark, so one's leftovers cannot slow the next.
        failed += subprocess.call([sys.executable, "-m", f"bench.{name}", *argv[1:]]) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
