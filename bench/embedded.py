"""The API, its dispatcher and a worker in one process, as `promptjobs dev` runs them, but
against the bench's Temporal server (so bare Temporal is measured on the same one).
Configured by PROMPTJOBS_* variables, like `promptjobs api`; stops on SIGTERM."""

from __future__ import annotations

import asyncio

from promptjobs.console import run
from promptjobs.launch import serve, stop_on_signals
from promptjobs.runtime import open_projection
from promptjobs.settings import Settings
from promptjobs.wiring import connect_temporal


async def main(settings: Settings) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    client = await connect_temporal(settings)
    async with open_projection(settings, listen=True) as projection:
        await serve(settings, client, projection, stop, run_worker=True, run_api=True)


if __name__ == "__main__":
    run(main(Settings()))
