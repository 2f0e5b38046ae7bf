"""The API's cache of verified keys on a real projection: under load a busy key costs one
lookup per TTL, never one per request in flight, and a revoked key still stops working
within the TTL."""

from __future__ import annotations

import asyncio

from projections.keys import KeyCache
from projections.scope import Scope
from projections.shared_reads import SharedReads
from promptjobs.wiring import Projection


async def test_requests_that_find_a_key_unverified_together_share_one_lookup(
    projection: Projection,
) -> None:
    keys = projection.store.keys
    issued = await keys.create("acme", "ann")
    cache = KeyCache(ttl_s=5.0)

    scopes = await asyncio.gather(*(cache.authenticate(keys, issued.secret) for _ in range(32)))

    assert scopes == [Scope("acme", "ann", "member", issued.key_id)] * 32
    assert cache.lookups == 1


async def test_a_busy_key_is_looked_up_again_before_it_expires_by_one_request(
    projection: Projection,
) -> None:
    keys = projection.store.keys
    issued = await keys.create("acme", "ann")
    cache = KeyCache(ttl_s=1.0)
    await cache.authenticate(keys, issued.secret)

    await asyncio.sleep(0.85)  # in the entry's last fifth
    scopes = await asyncio.gather(*(cache.authenticate(keys, issued.secret) for _ in range(32)))
    assert all(scope is not None for scope in scopes)
    assert cache.lookups == 2

    await asyncio.sleep(0.5)  # past the first entry's time: the refreshed one holds
    assert await cache.authenticate(keys, issued.secret) is not None
    assert cache.lookups == 2


async def test_a_revoked_key_stops_working_within_the_ttl_even_while_busy(
    projection: Projection,
) -> None:
    keys = projection.store.keys
    issued = await keys.create("acme", "ann")
    cache = KeyCache(ttl_s=1.0)
    assert await cache.authenticate(keys, issued.secret) is not None

    await keys.revoke(issued.key_id)
    loop = asyncio.get_running_loop()
    revoked_at = loop.time()
    while await cache.authenticate(keys, issued.secret) is not None:
        assert loop.time() - revoked_at < 1.0
        await asyncio.sleep(0.01)
    assert await cache.authenticate(keys, issued.secret) is None


async def test_a_wrong_token_is_looked_up_every_time_and_never_kept(
    projection: Projection,
) -> None:
    keys = projection.store.keys
    issued = await keys.create("acme", "ann")
    cache = KeyCache(ttl_s=5.0)
    wrong = issued.secret[:-2] + "xx"

    for _ in range(3):
        assert await cache.authenticate(keys, wrong) is None
    assert cache.lookups == 3


async def test_a_waiter_cancelled_leaves_the_shared_read_to_the_others() -> None:
    reads: SharedReads[str, int] = SharedReads()
    started = asyncio.Event()
    release = asyncio.Event()

    async def fetch() -> int:
        started.set()
        await release.wait()
        return 7

    first = asyncio.create_task(reads.read("k", fetch))
    await started.wait()
    second = asyncio.create_task(reads.read("k", fetch))
    await asyncio.sleep(0)
    first.cancel()
    release.set()

    assert await second == 7
    assert first.cancelled()
    assert not reads.pending("k")
