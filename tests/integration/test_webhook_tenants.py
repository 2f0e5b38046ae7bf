"""Issue 49: one tenant's webhook endpoint that hangs for its whole timeout holds back none of
another tenant's deliveries (a module of its own, so the suite's workers run it beside the
long acceptance test of test_webhook_delivery.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import eventually, make_settings, running_stack
from tests.integration.test_webhook_delivery import Receiver


@dataclass
class Tenants:
    stuck: Receiver
    fine: Receiver


@pytest.fixture
async def tenants() -> AsyncIterator[Tenants]:
    found = Tenants(Receiver(hang_s=30.0), Receiver())
    for receiver in (found.stuck, found.fine):
        await receiver.start()
    yield found
    for receiver in (found.stuck, found.fine):
        await receiver.stop()


async def test_a_tenants_hanging_endpoint_does_not_slow_anothers_deliveries(
    dev_server: WorkflowEnvironment, tmp_path: Path, tenants: Tenants
) -> None:
    settings = make_settings(tmp_path, webhook_allow_ranges=["127.0.0.0/8"], webhook_timeout_s=2.0)
    async with running_stack(settings, dev_server.client) as stack:
        keys = {org: await stack.key(org, "root", "admin") for org in ("stuck", "fine")}
        for org, receiver in (("stuck", tenants.stuck), ("fine", tenants.fine)):
            async with stack.as_user(keys[org]) as http:
                made = await http.post("/v1/webhooks", json={"url": receiver.url})
                receiver.secret = made.json()["secret"]

        async def submit(org: str, n: int) -> list[str]:
            async with stack.as_user(keys[org]) as http:
                answers = [
                    await http.post("/v1/prompts", json={"prompt": f"{org} {i}"}) for i in range(n)
                ]
            return [a.json()["job_id"] for a in answers]

        # The stuck tenant's 100 deliveries each hang for the whole timeout, and again; the
        # other tenant's are all delivered meanwhile, none of the stuck tenant's is.
        stuck = await submit("stuck", 100)
        fine = await submit("fine", 100)

        async def told() -> int:
            return len(tenants.fine.delivered)

        await eventually(told, lambda n: n == len(fine), timeout=120)
        assert tenants.stuck.delivered == {}
        async with stack.as_user(keys["stuck"]) as http:
            endpoint = (await http.get("/v1/webhooks")).json()["data"][0]["endpoint_id"]
            pending = (await http.get(f"/v1/webhooks/{endpoint}/deliveries?limit=1000")).json()
        assert len(pending["data"]) == len(stuck)
        assert {d["state"] for d in pending["data"]} == {"pending"}
        assert any("Timeout" in (d["last_error"] or "") for d in pending["data"])
