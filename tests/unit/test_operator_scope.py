"""Tenancy: the operator scope sees every org, and no API key can ever carry it."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from projections.errors import NotFound
from projections.models import ApiKey
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import Projection

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True


async def test_operator_sees_every_org_and_admins_only_their_own(projection: Projection) -> None:
    store = projection.store
    submission = Submission(text="hi", priority=50, max_attempts=3, options={})
    globex = (await store.submit(Scope("globex", "gus"), submission)).job

    assert (await store.job(Scope.operator(), globex.job_id)).org == "globex"
    with pytest.raises(NotFound):
        await store.job(Scope("acme", "root", "admin"), globex.job_id)


async def test_no_api_key_can_be_an_operator(projection: Projection) -> None:
    with pytest.raises(ValueError):
        await projection.store.keys.create("acme", "mallory", "operator")
    issued = await projection.store.keys.create("acme", "mallory", "admin")
    edit = update(ApiKey).where(ApiKey.key_id == issued.key_id).values(role="operator")
    await projection.projector.writes.run(lambda tx: tx.execute(edit))
    assert await projection.store.keys.authenticate(issued.secret) is None
