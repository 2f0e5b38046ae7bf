"""Webhooks (issue 49) on real processes: an admin registers an endpoint and gets its secret
once; each job's end reaches a receiver on loopback, signed so that the unmodified `openai`
SDK's `webhooks.unwrap` and the `standardwebhooks` package verify it; a receiver's failures
are tried again with the same `webhook-id`; 410 disables the endpoint; a URL that resolves
inside the network is refused at registration and at delivery; tenants see only theirs."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
import standardwebhooks
from aiohttp import web
from openai.types.webhooks import BatchCompletedWebhookEvent, ResponseCompletedWebhookEvent
from temporalio.testing import WorkflowEnvironment

from activities.webhooks import AddressRefused, Allowed, resolve
from tests.conftest import (
    Stack,
    cli,
    cli_env,
    cli_json,
    eventually,
    free_port,
    make_settings,
    running_stack,
)


@dataclass
class Receiver:
    """A webhook receiver on loopback: it keeps what it gets, and answers as told."""

    port: int = field(default_factory=free_port)
    got: list[dict[str, Any]] = field(default_factory=list)
    # Per event id: the statuses of its first tries (then 200).
    fail_first: dict[str, list[int]] = field(default_factory=dict)
    answer: int = 200
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hooks", self._take)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def events(self) -> list[dict[str, Any]]:
        """What it got, one receipt per event (the first): at least once means a receiver
        dedupes by `webhook-id`."""
        first: dict[str, dict[str, Any]] = {}
        for got in self.got:
            first.setdefault(got["headers"]["webhook-id"], got)
        return list(first.values())

    async def _take(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.got.append({"headers": headers, "body": body, "at": time.time()})
        planned = self.fail_first.get(headers["webhook-id"], [])
        tried = sum(1 for g in self.got if g["headers"]["webhook-id"] == headers["webhook-id"])
        if tried <= len(planned):
            return web.Response(status=planned[tried - 1], text="not now")
        return web.Response(status=self.answer)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    made = Receiver()
    await made.start()
    yield made
    await made.stop()


@pytest.fixture
async def hooked(dev_server: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    settings = make_settings(
        tmp_path, webhook_allow_ranges=["127.0.0.0/8"], webhook_first_retry_s=0.5
    )
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


async def register(stack: Stack, admin: str, url: str, **body: Any) -> dict[str, Any]:
    async with stack.as_user(admin) as http:
        made = await http.post("/v1/webhooks", json={"url": url, **body})
    assert made.status_code == 201, made.text
    endpoint: dict[str, Any] = made.json()
    return endpoint


async def test_a_jobs_end_reaches_the_receiver_signed_for_the_openai_sdk_and_standardwebhooks(
    hooked: Stack, receiver: Receiver
) -> None:
    admin = await hooked.key("acme", "root", "admin")
    endpoint = await register(hooked, admin, receiver.url, description="our backend")
    secret = endpoint["secret"]
    assert secret.startswith("whsec_") and endpoint["events"] == []
    ok = await hooked.submit("hello")
    bad = await hooked.submit("boom", options={"fake": {"fail": ["auth"]}})

    await eventually(lambda: asyncio.sleep(0, receiver.got), lambda got: len(got) >= 2)
    sdk = openai.OpenAI(api_key="unused", webhook_secret=secret)
    verifier = standardwebhooks.Webhook(secret)
    seen = {}
    for got in receiver.got:
        event = sdk.webhooks.unwrap(got["body"], got["headers"])
        verified = verifier.verify(got["body"], got["headers"])
        assert verified["id"] == event.id == got["headers"]["webhook-id"]
        seen[verified["data"]["job_id"]] = verified
    assert seen[ok["job_id"]]["type"] == "job.succeeded"
    assert seen[bad["job_id"]]["type"] == "job.failed"
    assert seen[bad["job_id"]]["data"]["error_kind"] == "auth"
    assert seen[ok["job_id"]]["object"] == "event"

    # A forged body fails both.
    forged = receiver.got[0]["body"].replace(b"succeeded", b"cancelled")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk.webhooks.unwrap(forged, receiver.got[0]["headers"])
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        verifier.verify(forged, receiver.got[0]["headers"])

    async with hooked.as_user(admin) as http:
        listed = (await http.get(f"/v1/webhooks/{endpoint['endpoint_id']}/deliveries")).json()
        assert {d["state"] for d in listed["data"]} == {"delivered"}
        assert {d["last_status"] for d in listed["data"]} == {200}
        shown = (await http.get("/v1/webhooks")).json()["data"]
        assert "secret" not in shown[0] and shown[0]["enabled"] is True


async def test_the_openai_routes_objects_end_as_openai_names_them(
    hooked: Stack, receiver: Receiver
) -> None:
    """A background response and a /v1/batches batch: `response.completed` and
    `batch.completed`, OpenAI's payloads, which its SDK unwraps into its own event types."""
    admin = await hooked.key("acme", "root", "admin")
    endpoint = await register(hooked, admin, receiver.url)
    sdk = openai.AsyncOpenAI(base_url=f"{hooked.base_url}/v1", api_key=hooked.api_key)
    response = await sdk.responses.create(model="fake/fake-1", input="hello", background=True)
    batch_input = json.dumps(
        {
            "custom_id": "one",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "fake/fake-1", "messages": [{"role": "user", "content": "hi"}]},
        }
    )
    uploaded = await sdk.files.create(file=("in.jsonl", batch_input.encode()), purpose="batch")
    batch = await sdk.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    def both(got: list[dict[str, Any]]) -> bool:
        types = {json.loads(g["body"])["type"] for g in got}
        return {"response.completed", "batch.completed"} <= types

    await eventually(lambda: asyncio.sleep(0, receiver.got), both, timeout=30)
    unwrapper = openai.OpenAI(api_key="unused", webhook_secret=endpoint["secret"])
    events = {}
    for got in receiver.got:
        event = unwrapper.webhooks.unwrap(got["body"], got["headers"])
        events[event.type] = event
    assert isinstance(events["response.completed"], ResponseCompletedWebhookEvent)
    assert events["response.completed"].data.id == response.id
    assert isinstance(events["batch.completed"], BatchCompletedWebhookEvent)
    assert events["batch.completed"].data.id == batch.id
    # The response's job and the batch's line are told as their response and batch, not a
    # second time as jobs.
    assert {json.loads(g["body"])["type"] for g in receiver.got} == {
        "response.completed",
        "batch.completed",
    }


async def test_a_failing_receiver_gets_each_event_again_with_the_same_webhook_id(
    hooked: Stack, receiver: Receiver
) -> None:
    admin = await hooked.key("acme", "root", "admin")
    endpoint = await register(hooked, admin, receiver.url, events=["job.succeeded"])
    receiver.answer = 500
    job = await hooked.submit("retry me")
    first = await eventually(lambda: asyncio.sleep(0, receiver.got), lambda got: len(got) >= 2)
    receiver.answer = 200
    await eventually(
        lambda: asyncio.sleep(0, receiver.got),
        lambda got: any(
            g["headers"]["webhook-id"] == first[0]["headers"]["webhook-id"] for g in got[2:]
        ),
        timeout=20,
    )
    ids = {g["headers"]["webhook-id"] for g in receiver.got}
    bodies = {g["body"] for g in receiver.got}
    assert len(ids) == 1 and len(bodies) == 1  # every try: the same id and the same body
    assert json.loads(receiver.got[0]["body"])["data"]["job_id"] == job["job_id"]
    async with hooked.as_user(admin) as http:

        async def delivered() -> list[dict[str, Any]]:
            url = f"/v1/webhooks/{endpoint['endpoint_id']}/deliveries"
            return list((await http.get(url)).json()["data"])

        [delivery] = await eventually(delivered, lambda d: d and d[0]["state"] == "delivered")
        assert delivery["attempts"] >= 3 and delivery["last_status"] == 200


async def test_410_gone_disables_the_endpoint_and_it_can_be_enabled_again(
    hooked: Stack, receiver: Receiver
) -> None:
    admin = await hooked.key("acme", "root", "admin")
    endpoint = await register(hooked, admin, receiver.url)
    receiver.answer = 410
    await hooked.submit("gone")
    async with hooked.as_user(admin) as http:
        url = f"/v1/webhooks/{endpoint['endpoint_id']}"
        shown = await eventually(lambda: http.get(url), lambda r: not r.json()["enabled"])
        assert "410" in shown.json()["disabled_reason"]
        again = await http.patch(url, json={"enabled": True})
        assert again.json()["enabled"] is True and again.json()["disabled_reason"] is None


async def test_urls_inside_the_network_are_refused_at_registration_and_at_delivery(
    stack: Stack,
) -> None:
    """No operator allowance here: loopback, private and metadata addresses are refused,
    and nothing is sent to them."""
    admin = await stack.key("acme", "root", "admin")
    async with stack.as_user(admin) as http:
        for url in (
            "http://169.254.169.254/latest/meta-data",
            "http://10.0.0.1/hook",
            "http://localhost:8080/hook",  # a name that resolves to 127.0.0.1
            "https://[::1]/hook",
            "ftp://example.com/hook",
        ):
            refused = await http.post("/v1/webhooks", json={"url": url})
            assert refused.status_code == 422, (url, refused.text)
            assert refused.json()["code"] == "invalid_webhook_url", url
    # At delivery the address is checked again, and pinned: allowed hosts aside, a name
    # whose answer now points inside is refused before any connection.
    for url in ("http://localhost/x", "http://169.254.169.254/x", "http://[::ffff:127.0.0.1]/x"):
        with pytest.raises(AddressRefused):
            await resolve(url, Allowed())
    target = await resolve("http://localhost:9/x", Allowed.of(["localhost"], []))
    assert target.address == "localhost"


async def test_only_an_orgs_admins_see_and_change_its_endpoints(
    hooked: Stack, receiver: Receiver
) -> None:
    admin = await hooked.key("acme", "root", "admin")
    member = await hooked.key("acme", "ann")
    stranger = await hooked.key("initech", "milton", "admin")
    endpoint = await register(hooked, admin, receiver.url)
    url = f"/v1/webhooks/{endpoint['endpoint_id']}"
    async with hooked.as_user(member) as http:
        assert (await http.get("/v1/webhooks")).status_code == 403
    async with hooked.as_user(stranger) as http:
        assert (await http.get(url)).status_code == 404
        assert (await http.delete(url)).status_code == 404
        assert (await http.get("/v1/webhooks")).json()["data"] == []
    async with hooked.as_user(admin) as http:
        rotated = (await http.post(f"{url}/rotate", json={"overlap_s": 60})).json()
        assert rotated["secret"] != endpoint["secret"]
        assert (await http.delete(url)).status_code == 204
        assert (await http.get(url)).status_code == 404


async def cli_failing(stack: Stack, *args: str) -> str:
    """`promptjobs <args>` that must fail: its one-line error."""
    from typer.testing import CliRunner

    from promptjobs.cli import app

    result = await asyncio.to_thread(CliRunner().invoke, app, list(args), env=cli_env(stack))
    assert result.exit_code != 0, result.output
    return str(result.exception)


async def test_an_operator_manages_an_orgs_endpoints_with_the_cli(
    hooked: Stack, receiver: Receiver
) -> None:
    allow = {"PROMPTJOBS_WEBHOOK_ALLOW_RANGES": '["127.0.0.0/8"]'}
    made = await cli_json(hooked, "webhooks", "create", receiver.url, "--org", "acme", **allow)
    assert made["secret"].startswith("whsec_") and made["enabled"] is True
    refused = await cli_failing(hooked, "webhooks", "create", "http://10.0.0.1/x", "--org", "acme")
    assert "inside a network" in refused
    await hooked.submit("told")
    endpoint = made["endpoint_id"]

    async def delivered() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await cli_json(
            hooked, "webhooks", "deliveries", endpoint, "--org", "acme"
        )
        return found

    [delivery] = await eventually(delivered, lambda d: d and d[0]["state"] == "delivered")
    assert delivery["event_type"] == "job.succeeded" and delivery["last_status"] == 200
    await cli(
        hooked,
        "webhooks",
        "redeliver",
        endpoint,
        "--org",
        "acme",
        "--delivery",
        delivery["delivery_id"],
    )
    await eventually(lambda: asyncio.sleep(0, receiver.got), lambda got: len(got) >= 2)
    assert len({g["headers"]["webhook-id"] for g in receiver.got}) == 1
    await cli(hooked, "webhooks", "update", endpoint, "--org", "acme", "--disable")
    [listed] = await cli_json(hooked, "webhooks", "list", "--org", "acme")
    assert listed["enabled"] is False and "secret" not in listed
    await cli(hooked, "webhooks", "delete", endpoint, "--org", "acme")
    assert await cli_json(hooked, "webhooks", "list", "--org", "acme") == []


async def test_retention_removes_deliveries_made_or_given_up_but_not_those_still_tried(
    hooked: Stack, receiver: Receiver
) -> None:
    admin = await hooked.key("acme", "root", "admin")
    endpoint = await register(hooked, admin, receiver.url)
    done = await hooked.submit("delivered")
    webhooks = hooked.projection.store.webhooks

    async def states() -> list[str]:
        found = await webhooks.deliveries("acme", endpoint["endpoint_id"])
        return sorted(d.state for d in found)

    await eventually(states, lambda s: s == ["delivered"])
    receiver.answer = 500
    await hooked.submit("still tried")
    await eventually(
        lambda: webhooks.deliveries("acme", endpoint["endpoint_id"]),
        lambda found: any(d.attempts >= 1 and d.state == "pending" for d in found),
    )

    removed = await hooked.projection.store.operations.archive_storage(
        before=datetime.now(UTC) + timedelta(seconds=1)
    )

    assert removed.webhook_deliveries == 1
    [left] = await webhooks.deliveries("acme", endpoint["endpoint_id"])
    assert left.state == "pending" and left.job_id != done["job_id"]


# -- a job's own webhook (a submission's `webhook`) ------------------------------------------


async def test_a_job_names_its_own_webhook_signed_with_its_orgs_secret(
    hooked: Stack, receiver: Receiver
) -> None:
    """No endpoint registered: the job's own URL hears its end, signed with the secret any
    key of the org reads at /v1/webhooks/default/secret; a retry's job keeps the webhook."""
    member = await hooked.key("acme", "ann")
    async with hooked.as_user(member) as http:
        sent = await http.post(
            "/v1/prompts",
            json={
                "prompt": "boom",
                "options": {"fake": {"fail": ["auth"]}},
                "webhook": receiver.url,
            },
        )
        assert sent.status_code == 202, sent.text
        failed = sent.json()
        secret = (await http.get("/v1/webhooks/default/secret")).json()["key"]
        shown = (await http.get(f"/v1/jobs/{failed['job_id']}")).json()
        assert shown["webhook"] == receiver.url and shown["webhook_events"] is None
        await eventually(receiver.events, lambda got: len(got) == 1)
        retried = (await http.post(f"/v1/jobs/{failed['job_id']}/retry", json={})).json()

    # The old job's `job.superseded`, then the new one's end; the fake fails it again.
    got = await eventually(receiver.events, lambda got: len(got) == 3)
    sdk = openai.OpenAI(api_key="unused", webhook_secret=secret)
    verifier = standardwebhooks.Webhook(secret)
    told = []
    for one in got:
        event = sdk.webhooks.unwrap(one["body"], one["headers"])
        verified = verifier.verify(one["body"], one["headers"])
        assert verified["id"] == event.id == one["headers"]["webhook-id"]
        told.append((verified["type"], verified["data"]["job_id"]))
    assert sorted(told) == sorted(
        [
            ("job.failed", failed["job_id"]),
            ("job.superseded", failed["job_id"]),
            ("job.failed", retried["job_id"]),
        ]
    )


async def test_a_jobs_webhook_hears_only_the_events_it_names_besides_the_orgs_endpoints(
    hooked: Stack, receiver: Receiver
) -> None:
    admin = await hooked.key("acme", "root", "admin")
    endpoint = await register(hooked, admin, receiver.url)
    job = await hooked.submit("hello", webhook=receiver.url, webhook_events=["job.running"])

    got = await eventually(receiver.events, lambda got: len(got) == 2)
    await asyncio.sleep(0.5)  # nothing more comes
    assert len(await receiver.events()) == 2
    told = {json.loads(g["body"])["type"]: g for g in got}
    assert set(told) == {"job.running", "job.succeeded"}
    # The job's own (job.running) is signed by the org's secret, the endpoint's by its own.
    async with hooked.as_user(admin) as http:
        secret = (await http.get("/v1/webhooks/default/secret")).json()["key"]
        own = (await http.get("/v1/webhooks/default/deliveries")).json()["data"]
        assert [(d["event_type"], d["job_id"], d["url"]) for d in own] == [
            ("job.running", job["job_id"], receiver.url)
        ]
        rotated = (await http.post("/v1/webhooks/default/rotate", json={"overlap_s": 60})).json()
        assert rotated["key"] != secret and rotated["previous_until"] is not None
    standardwebhooks.Webhook(secret).verify(
        told["job.running"]["body"], told["job.running"]["headers"]
    )
    standardwebhooks.Webhook(endpoint["secret"]).verify(
        told["job.succeeded"]["body"], told["job.succeeded"]["headers"]
    )
    # After the rotation both secrets sign, so a receiver switching over misses nothing.
    await hooked.submit("again", webhook=receiver.url)
    got = await eventually(receiver.events, lambda got: len(got) == 4)
    [mine] = [g for g in got[2:] if len(g["headers"]["webhook-signature"].split()) == 2]
    for key in (secret, rotated["key"]):
        standardwebhooks.Webhook(key).verify(mine["body"], mine["headers"])


async def test_a_jobs_webhook_is_refused_inside_the_network_and_without_a_url(
    stack: Stack,
) -> None:
    """Bad input is a 422 that says what to fix, and nothing is accepted."""
    for body, code in (
        ({"webhook": "http://169.254.169.254/latest"}, "invalid_webhook_url"),
        ({"webhook": "http://localhost:9/x"}, "invalid_webhook_url"),
        ({"webhook_events": ["job.running"]}, None),
        ({"webhook": "https://example.com/x", "webhook_events": ["job.started"]}, None),
        ({"webhook": "https://example.com/x", "webhook_events": []}, None),
    ):
        refused = await stack.http.post("/v1/prompts", json={"prompt": "x", **body})
        assert refused.status_code == 422, (body, refused.text)
        if code is not None:
            assert refused.json()["code"] == code
            assert "webhook:" in refused.json()["detail"]
    assert (await stack.http.get("/v1/jobs")).json()["jobs"] == []


async def test_only_an_orgs_admins_see_its_jobs_webhook_deliveries(
    hooked: Stack, receiver: Receiver
) -> None:
    admin = await hooked.key("acme", "root", "admin")
    member = await hooked.key("acme", "ann")
    stranger = await hooked.key("initech", "milton", "admin")
    await hooked.submit("mine", webhook=receiver.url)
    await eventually(receiver.events, lambda got: len(got) == 1)
    async with hooked.as_user(member) as http:
        assert (await http.get("/v1/webhooks/default/deliveries")).status_code == 403
        assert (await http.post("/v1/webhooks/default/rotate")).status_code == 403
    async with hooked.as_user(stranger) as http:
        assert (await http.get("/v1/webhooks/default/deliveries")).json()["data"] == []
        theirs = (await http.get("/v1/webhooks/default/secret")).json()["key"]
    async with hooked.as_user(admin) as http:
        [delivery] = (await http.get("/v1/webhooks/default/deliveries")).json()["data"]
        assert delivery["state"] == "delivered"
        assert (await http.get("/v1/webhooks/default/secret")).json()["key"] != theirs
    assert await cli_json(hooked, "webhooks", "deliveries", "default", "--org", "initech") == []
    [shown] = await cli_json(hooked, "webhooks", "deliveries", "default", "--org", "acme")
    assert shown["delivery_id"] == delivery["delivery_id"] and shown["url"] == receiver.url
