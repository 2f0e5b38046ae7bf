"""Export a job's workflow history in the JSON the Replayer reads (`temporal workflow show`)."""

from __future__ import annotations

import json

from temporalio.client import Client


async def export_history(client: Client, job_id: str) -> str:
    """The history of the job's workflow (workflow id = job id) as pretty JSON."""
    history = await client.get_workflow_handle(job_id).fetch_history()
    return json.dumps(history.to_json_dict(), indent=2) + "\n"
