"""Our workflow's shape, part by part: what each part of it costs the engine, with no process
of ours running.

Bare Temporal's one-activity workflow (bench/bare.py), then the same with each part of our
job's workflow alone (its patch, the activity's timeouts, the final upsert, the search
attributes and the priority key it starts with), then with all of them: jobs/s and whose CPU
per job. Two rounds, the second in reverse order, so the dev server's database growing over
the run weighs on every variant alike. [JOBS] [pinned]"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bench.bare import FOUR_PATCHES, ONE_PATCH, OUR_SHAPE, bare_temporal
from bench.harness import Report, args, bench_stack

ARGS = args(default_count=1000)
JOBS = ARGS.count
CONCURRENCY = 32

VARIANTS: list[tuple[str, Sequence[str]]] = [
    ("plain", ()),
    *[(part, (part,)) for part in OUR_SHAPE],
    ("our whole shape", OUR_SHAPE),
    # As workflows started before `patches-2026-12` are: a marker for each of four patches.
    (FOUR_PATCHES, (FOUR_PATCHES,)),
    ("our whole shape, four patches", (*(p for p in OUR_SHAPE if p != ONE_PATCH), FOUR_PATCHES)),
]


async def main() -> Report:
    report = Report(
        "our workflow's shape, part by part",
        {
            "jobs": f"{JOBS} per variant, started with {CONCURRENCY} in flight",
            "variants": ", ".join(name for name, _ in VARIANTS),
            "Temporal": "one dev server on disk (WAL pragmas), one bare worker process",
        },
    )
    report.start()
    async with bench_stack(ARGS) as (_, env, _overrides):
        for round_, order in ((1, VARIANTS), (2, VARIANTS[::-1])):
            for name, shape in order:
                seconds, cpu = await bare_temporal(env, JOBS, CONCURRENCY, shape=shape)
                report.add(f"round {round_}, {name}", f"{JOBS / seconds:.1f} jobs/s; {cpu}")
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
