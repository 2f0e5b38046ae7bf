"""/v1/batches: OpenAI's Batch API; each line of the input file is one promptjobs job."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictStr

from api.deps import ApiContext, Caller, ContextDep, JsonBody
from api.openai.batches import ENDPOINTS, WINDOWS, batch_object
from api.openai.responses import METADATA_PAIRS, UnsupportedParameter
from api.problems import problem_responses
from api.routes.files import OPENAI_LIST, listing
from projections.event_log import utcnow
from projections.models import Batch

router = APIRouter(prefix="/v1/batches", tags=["openai"])

# Statuses whose request counts are read from the jobs (later ones were written at the end).
RUNNING = ("in_progress", "cancelling", "finalizing")


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input_file_id: StrictStr
    endpoint: StrictStr
    completion_window: StrictStr
    metadata: dict[StrictStr, StrictStr] | None = None
    output_expires_after: dict[str, Any] | None = None


@router.post(
    "", response_model=None, responses={200: OPENAI_LIST, **problem_responses(400, 401, 404)}
)
async def create_batch(
    body: CreateBatch, caller: Caller, _json: Annotated[None, JsonBody], ctx: ContextDep
) -> JSONResponse:
    """OpenAI's `batches.create`: answers at once (`validating`); the file's lines become jobs
    in the background, then the batch is `in_progress` until they have all settled."""
    if body.endpoint not in ENDPOINTS:
        raise UnsupportedParameter(
            "endpoint",
            f"endpoint {body.endpoint!r} is not supported: use one of {', '.join(ENDPOINTS)}",
            code="invalid_value",
        )
    window = WINDOWS.get(body.completion_window)
    if window is None:
        raise UnsupportedParameter(
            "completion_window", "completion_window must be `24h`", code="invalid_value"
        )
    if body.metadata is not None and len(body.metadata) > METADATA_PAIRS:
        raise UnsupportedParameter(
            "metadata", "metadata holds at most 16 pairs", code="invalid_value"
        )
    stored = await ctx.store.files.get(caller, body.input_file_id)
    if stored.purpose != "batch":
        raise UnsupportedParameter(
            "input_file_id", "the input file must have purpose `batch`", code="invalid_value"
        )
    now = utcnow()
    batch = await ctx.store.batches.create(
        caller,
        {
            "endpoint": body.endpoint,
            "input_file_id": body.input_file_id,
            "completion_window": body.completion_window,
            "meta": body.metadata,
            "expires_at": now + window,
        },
    )
    ctx.batches.kick()
    return JSONResponse(batch_object(batch))


@router.get("", response_model=None, responses={200: OPENAI_LIST, **problem_responses(401)})
async def list_batches(
    caller: Caller,
    ctx: ContextDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> JSONResponse:
    page = await ctx.store.batches.page(caller, limit=limit + 1, after=after)
    objects = [await _object(ctx, batch) for batch in page[:limit]]
    return JSONResponse(listing(objects, len(page) > limit))


@router.get(
    "/{batch_id}", response_model=None, responses={200: OPENAI_LIST, **problem_responses(401, 404)}
)
async def read_batch(batch_id: str, caller: Caller, ctx: ContextDep) -> JSONResponse:
    return JSONResponse(await _object(ctx, await ctx.store.batches.get(caller, batch_id)))


@router.post(
    "/{batch_id}/cancel",
    response_model=None,
    responses={200: OPENAI_LIST, **problem_responses(401, 404)},
)
async def cancel_batch(batch_id: str, caller: Caller, ctx: ContextDep) -> JSONResponse:
    """OpenAI's `batches.cancel`: `cancelling` while its open jobs are cancelled, then
    `cancelled` with the output of those that finished. A batch already over is answered as
    it is."""
    batch = await ctx.store.batches.get(caller, batch_id)
    await ctx.store.batches.move(
        batch.batch_id,
        "cancelling",
        came_from=("validating", "in_progress"),
        cancelling_at=utcnow(),
    )
    ctx.batches.kick()
    return JSONResponse(await _object(ctx, await ctx.store.batches.get(caller, batch_id)))


async def _object(ctx: ApiContext, batch: Batch) -> dict[str, Any]:
    counts = await ctx.store.batches.counts(batch.batch_id) if batch.status in RUNNING else None
    return batch_object(batch, counts)
