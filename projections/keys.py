"""API keys: created once and shown once, stored only as a hash."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.db import transaction
from projections.models import ApiKey
from projections.projector import utcnow
from projections.scope import Scope

ROLES = ("member", "admin")
PREFIX = "pj"


@dataclass(frozen=True)
class IssuedKey:
    key_id: str
    secret: str  # the whole bearer token; never stored
    scope: Scope


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_key(
    sessions: async_sessionmaker[AsyncSession], org: str, user: str, role: str = "member"
) -> IssuedKey:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    key_id = secrets.token_hex(6)
    token = f"{PREFIX}_{key_id}_{secrets.token_urlsafe(24)}"
    async with transaction(sessions) as session:
        session.add(
            ApiKey(
                key_id=key_id,
                key_hash=_hash(token),
                org=org,
                user=user,
                role=role,
                created_at=utcnow(),
            )
        )
    return IssuedKey(key_id, token, Scope(org, user, role))


def key_id_of(token: str) -> str | None:
    """The key id a bearer token names (`pj_<key id>_<secret>`), unverified."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != PREFIX:
        return None
    return parts[1]


async def live_key_ids(sessions: async_sessionmaker[AsyncSession], key_ids: set[str]) -> set[str]:
    """Those of `key_ids` that still exist and are not revoked: one query for any number."""
    async with sessions() as session:
        rows = await session.execute(
            select(ApiKey.key_id).where(ApiKey.key_id.in_(key_ids), ApiKey.revoked_at.is_(None))
        )
        return set(rows.scalars())


async def authenticate(sessions: async_sessionmaker[AsyncSession], token: str) -> Scope | None:
    key_id = key_id_of(token)
    if key_id is None:
        return None
    async with sessions() as session:
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
    return Scope(key.org, key.user, key.role)
