"""One answer Temporal gives that is no fault: the workflow (or schedule) asked about is not
there."""

from __future__ import annotations

from collections.abc import Awaitable
from enum import Enum
from typing import Literal, TypeVar

from temporalio.service import RPCError, RPCStatusCode

T = TypeVar("T")


class Gone(Enum):
    """What `unless_gone` answers for a workflow Temporal does not have."""

    GONE = "gone"


GONE = Gone.GONE


async def unless_gone(call: Awaitable[T]) -> T | Literal[Gone.GONE]:
    """`call`'s answer, or GONE if Temporal says its workflow (or schedule) is not there: a
    job whose workflow is gone needs no signal, no cancel, no termination."""
    try:
        return await call
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return GONE
        raise
