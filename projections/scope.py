"""Who is asking, and what of the projection they may see: tenancy in one place."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Select
from sqlalchemy.ext.asyncio import AsyncSession

from projections.errors import NotFound
from projections.models import Batch, Job, Prompt, Response, StoredFile

Row = TypeVar("Row", Job, Prompt, Response, StoredFile, Batch)

OPERATOR_ROLE = "operator"


@dataclass(frozen=True)
class Scope:
    """Who is asking. Admins see their whole org; members only what they authored; the
    operator (the CLI on the service's own database, never an API key) sees every org."""

    org: str
    user: str
    role: str = "member"
    # The API key asking (None: the operator, or work made on a caller's behalf): the jobs it
    # submits count against its spend cap (projections/spend.py).
    key_id: str | None = None

    @classmethod
    def operator(cls, user: str = "operator") -> Scope:
        return cls("*", user, OPERATOR_ROLE)

    @property
    def all_orgs(self) -> bool:
        return self.role == OPERATOR_ROLE

    @property
    def author(self) -> str | None:
        return None if self.role in ("admin", OPERATOR_ROLE) else self.user


# Ids we issue are short and plain; anything else cannot name a row, and asking the database
# about it (PostgreSQL rejects NUL in text) would only turn a 404 into a 500.
_ID_SHAPE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def plausible(ident: str) -> bool:
    return _ID_SHAPE.fullmatch(ident) is not None


def scoped(stmt: Select[Any], model: Any, scope: Scope) -> Select[Any]:
    """`stmt` narrowed to the rows of `model` that `scope` may see."""
    if scope.all_orgs:
        return stmt
    stmt = stmt.where(model.org == scope.org)
    if scope.author is not None:
        stmt = stmt.where(model.author == scope.author)
    return stmt


def visible(row: Job | Prompt | Response | StoredFile | Batch, scope: Scope) -> bool:
    if scope.all_orgs:
        return True
    return row.org == scope.org and (scope.author is None or row.author == scope.author)


async def get_visible(
    session: AsyncSession, model: type[Row], what: str, ident: str, scope: Scope
) -> Row:
    """The row `ident` of `model` if `scope` may see it; otherwise NotFound, as for no row."""
    row = await session.get(model, ident) if plausible(ident) else None
    if row is None or not visible(row, scope):
        raise NotFound(what, ident)
    return row


def newest_first(
    stmt: Select[Any], created: Any, ident: Any, anchor: Any | None, *, oldest: bool = False
) -> Select[Any]:
    """`stmt` in newest-first order (`oldest`: oldest first), from after `anchor` (the last
    row of the page before: rows older, or newer, than it, ties broken by id) when given."""
    if anchor is not None:
        anchor_id = getattr(anchor, ident.key)
        if oldest:
            stmt = stmt.where(
                (created > anchor.created_at)
                | ((created == anchor.created_at) & (ident > anchor_id))
            )
        else:
            stmt = stmt.where(
                (created < anchor.created_at)
                | ((created == anchor.created_at) & (ident < anchor_id))
            )
    if oldest:
        return stmt.order_by(created.asc(), ident.asc())
    return stmt.order_by(created.desc(), ident.desc())
