"""API keys: created once and shown once, stored only as a hash; listed, revoked, and
verified on the request path through a short-lived cache."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.event_log import utcnow
from projections.group_commit import GroupCommit, WriteTx
from projections.models import ApiKey, Base
from projections.scope import Scope
from projections.shared_reads import SharedReads

KEYS = Base.metadata.tables[ApiKey.__tablename__]
ROLES = ("member", "admin")
PREFIX = "pj"
# The width of the org and user columns (PostgreSQL enforces it; SQLite would not).
NAME_CHARS = 64


@dataclass(frozen=True)
class IssuedKey:
    key_id: str
    secret: str  # the whole bearer token; never stored
    scope: Scope


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def key_id_of(token: str) -> str | None:
    """The key id a bearer token names (`pj_<key id>_<secret>`), unverified."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != PREFIX:
        return None
    return parts[1]


@dataclass(frozen=True)
class Revoked:
    key: ApiKey
    already: bool  # it was revoked before (its first date stands)


class KeyStore:
    """The API keys in the projection (`JobStore.keys`): made, verified, listed, revoked."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    async def create(
        self, org: str, user: str, role: str = "member", *, usd_per_day: float | None = None
    ) -> IssuedKey:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        for what, name in (("org", org), ("user", user)):
            if not name or len(name) > NAME_CHARS or not name.isprintable() or name != name.strip():
                raise ValueError(
                    f"{what} must be 1 to {NAME_CHARS} printable characters without spaces at "
                    f"either end, not {name[:80]!r}"
                )
        key_id = secrets.token_hex(6)
        token = f"{PREFIX}_{key_id}_{secrets.token_urlsafe(24)}"
        row = {
            "key_id": key_id,
            "key_hash": _hash(token),
            "org": org,
            "user": user,
            "role": role,
            "created_at": utcnow(),
            "usd_per_day": usd_per_day,
        }
        await self.writes.run(lambda tx: tx.execute(insert(KEYS), row))
        return IssuedKey(key_id, token, Scope(org, user, role, key_id))

    async def live_ids(self, key_ids: set[str]) -> set[str]:
        """Those of `key_ids` that still exist and are not revoked: one query for any number."""
        async with self.sessions() as session:
            rows = await session.execute(
                select(ApiKey.key_id).where(ApiKey.key_id.in_(key_ids), ApiKey.revoked_at.is_(None))
            )
            return set(rows.scalars())

    async def authenticate(self, token: str) -> Scope | None:
        key_id = key_id_of(token)
        if key_id is None:
            return None
        async with self.sessions() as session:
            key = (
                await session.execute(select(ApiKey).where(ApiKey.key_id == key_id))
            ).scalar_one_or_none()
        if key is None or key.revoked_at is not None:
            return None
        if not hmac.compare_digest(key.key_hash, _hash(token)):
            return None
        if key.role not in ROLES:
            # Only member and admin keys exist; a row edited to claim more grants nothing.
            return None
        return Scope(key.org, key.user, key.role, key.key_id)

    async def list(self, org: str | None = None) -> list[ApiKey]:
        """Every key (of `org`), oldest first, revoked ones included: an operator's view."""
        stmt = select(ApiKey).order_by(ApiKey.created_at, ApiKey.key_id)
        if org is not None:
            stmt = stmt.where(ApiKey.org == org)
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def revoke(self, key: str) -> Revoked | None:
        """Revoke a key, named by its id or given whole (`pj_<id>_<secret>`); again is a no-op
        that keeps the first date. None if there is no such key. API processes stop accepting
        it within their cache's TTL (`KeyCache`)."""
        key_id = key_id_of(key) or key

        def write(tx: WriteTx) -> Revoked | None:
            changed = tx.execute(
                update(KEYS)
                .where(KEYS.c.key_id == key_id, KEYS.c.revoked_at.is_(None))
                .values(revoked_at=utcnow())
                .returning(KEYS.c.key_id)
            )
            newly = changed.first() is not None
            found = tx.execute(select(KEYS).where(KEYS.c.key_id == key_id)).first()
            return None if found is None else Revoked(ApiKey(**found._mapping), already=not newly)

        return await self.writes.run(write)


class KeyCache:
    """Keys verified in the last `ttl_s` seconds, so a request costs no key lookup.

    Only successes are kept (a wrong token costs a lookup each time, and cannot fill the
    cache), by the token's hash, at most `max_keys` of them, least recently used out first.
    A revoked key therefore stops working within `ttl_s` in every API process: an entry
    lasts `ttl_s` from the start of the lookup that made it.

    Under load a busy key never expires on the request path: the first request in the last
    `REFRESH_AHEAD` of an entry's time looks it up again while the others go on with it, and
    the requests that do find it expired share one lookup (`SharedReads`)."""

    REFRESH_AHEAD = 0.2

    def __init__(self, ttl_s: float = 5.0, max_keys: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._verified: OrderedDict[str, tuple[float, Scope]] = OrderedDict()
        self._lookups: SharedReads[str, Scope | None] = SharedReads()
        self.lookups = 0

    async def authenticate(self, keys: KeyStore, token: str) -> Scope | None:
        digest = _hash(token)
        now = time.monotonic()
        hit = self._verified.get(digest)
        if hit is not None and hit[0] > now:
            self._verified.move_to_end(digest)
            if hit[0] - now > self.ttl_s * self.REFRESH_AHEAD or self._lookups.pending(digest):
                return hit[1]
        else:
            self._verified.pop(digest, None)
        return await self._lookups.read(digest, lambda: self._look_up(keys, token, digest))

    async def _look_up(self, keys: KeyStore, token: str, digest: str) -> Scope | None:
        started = time.monotonic()
        self.lookups += 1
        scope = await keys.authenticate(token)
        if scope is None:
            self._verified.pop(digest, None)  # revoked meanwhile: not another request more
        elif self.ttl_s > 0:
            self._verified[digest] = (started + self.ttl_s, scope)
            self._verified.move_to_end(digest)
            while len(self._verified) > self.max_keys:
                self._verified.popitem(last=False)
        return scope
