"""GET /v1/usage (issue 48): what a key's jobs have spent today and this month, a member's
own, an admin's whole org by model and by user, and nothing of another org's."""

from __future__ import annotations

from typing import Any

from projections.keys import key_id_of
from tests.conftest import Stack, eventually


async def run(stack: Stack, key: str, n: int, **options: Any) -> None:
    async with stack.as_user(key) as http:
        for i in range(n):
            body = {"prompt": f"spend {i}", "options": {"provider": "fake", **options}}
            job_id = (await http.post("/v1/prompts", json=body)).json()["job_id"]
            await eventually(
                lambda job_id=job_id: http.get(f"/v1/jobs/{job_id}"),
                lambda r: r.json()["state"] == "succeeded",
            )


async def usage(stack: Stack, key: str) -> dict[str, Any]:
    async with stack.as_user(key) as http:
        answer = await http.get("/v1/usage")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_members_read_their_own_spend_and_admins_their_orgs(stack: Stack) -> None:
    ann = await stack.key("umbrella", "ann")
    bob = await stack.key("umbrella", "bob")
    admin = await stack.key("umbrella", "root", "admin")
    stranger = await stack.key("initech", "milton", "admin")
    await run(stack, ann, 2)
    await run(stack, bob, 1, model="fake-2", fake={"fail": ["provider_5xx"]})

    mine = await usage(stack, ann)
    assert (mine["org"], mine["user"]) == ("umbrella", "ann")
    today = mine["today"]
    assert (today["attempts"], today["unpriced_attempts"], today["cost_usd"]) == (2, 0, 0.0)
    assert today["input_tokens"] > 0 and today["output_tokens"] > 0
    assert [(m["provider"], m["model"], m["attempts"]) for m in today["by_model"]] == [
        ("fake", "fake-1", 2)
    ]
    assert today["by_user"] is None
    assert mine["month"]["attempts"] >= today["attempts"]

    org = (await usage(stack, admin))["today"]
    assert org["attempts"] == 4  # bob's job failed once, then succeeded
    assert [(u["user"], u["attempts"]) for u in org["by_user"]] == [("ann", 2), ("bob", 2)]
    assert [(m["model"], m["attempts"]) for m in org["by_model"]] == [
        ("fake-1", 2),
        ("fake-2", 2),
    ]

    elsewhere = (await usage(stack, stranger))["today"]
    assert (elsewhere["attempts"], elsewhere["by_model"], elsewhere["by_user"]) == (0, [], [])
    assert [(k["key_id"], k["attempts"]) for k in org["by_key"]] == sorted(
        [(key_id_of(ann), 2), (key_id_of(bob), 2)]
    )


async def test_usage_names_the_caps_a_key_counts_against(stack: Stack) -> None:
    ann = await stack.key("umbrella", "ann")
    bob = await stack.key("umbrella", "bob")
    caps = stack.projection.store.spend_caps
    await caps.set_org_cap("umbrella", 20.0)
    await caps.set_key_cap(str(key_id_of(ann)), 2.5)
    await run(stack, ann, 1)

    mine = await usage(stack, ann)
    assert [(c["key_id"], c["usd_per_day"]) for c in mine["caps"]] == [
        (None, 20.0),
        (key_id_of(ann), 2.5),
    ]
    assert mine["caps"][0]["spent_usd"] == 0.0 and mine["caps"][0]["resets_at"].endswith(
        "T00:00:00Z"
    )
    assert [c["key_id"] for c in (await usage(stack, bob))["caps"]] == [None]
    assert [k["key_id"] for k in mine["today"]["by_key"]] == [key_id_of(ann)]
