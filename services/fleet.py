"""What Temporal says about the fleet: who polls the task queue, and its backlog."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client


async def task_queue_pollers(client: Client, task_queue: str) -> list[dict[str, Any]]:
    """Who polls the task queue, per kind, and the approximate backlog Temporal reports."""
    pollers: list[dict[str, Any]] = []
    kinds = {
        "workflow": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        "activity": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    }
    for kind, queue_type in kinds.items():
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=queue_type,
                report_stats=True,
            )
        )
        backlog = described.stats.approximate_backlog_count
        for poller in described.pollers:
            pollers.append(
                {
                    "kind": kind,
                    "identity": poller.identity,
                    "last_access_time": poller.last_access_time.ToDatetime(tzinfo=UTC),
                    "backlog": backlog,
                }
            )
    return pollers
