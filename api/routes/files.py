"""/v1/files: OpenAI's Files API, for batch input files (and the output files batches write)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import JSONResponse, StreamingResponse

from api.deps import Caller, ContextDep
from api.openai.responses import UnsupportedParameter
from api.problems import problem_responses
from projections.models import StoredFile
from projections.openai_batches import timestamp

router = APIRouter(prefix="/v1/files", tags=["openai"])

PURPOSES = ("batch",)
OPENAI_LIST = {"description": "OpenAI's shapes (see docs/openai.md)"}


def file_object(stored: StoredFile) -> dict[str, Any]:
    return {
        "id": stored.file_id,
        "object": "file",
        "bytes": stored.bytes,
        "created_at": timestamp(stored.created_at),
        "filename": stored.filename,
        "purpose": stored.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


@router.post(
    "", response_model=None, responses={200: OPENAI_LIST, **problem_responses(400, 401, 413)}
)
async def upload_file(
    caller: Caller,
    ctx: ContextDep,
    file: Annotated[UploadFile, File(description="The file; JSONL for a batch")],
    purpose: Annotated[str, Form(description="`batch`")],
) -> JSONResponse:
    """OpenAI's `files.create`: the file is stored in the database a chunk at a time."""
    if purpose not in PURPOSES:
        raise UnsupportedParameter(
            "purpose", f"purpose {purpose!r} is not supported: promptjobs takes `batch` files"
        )
    stored = await ctx.store.files.create(
        caller,
        purpose=purpose,
        filename=(file.filename or "upload.jsonl")[:255],
        source=file.file,
        max_bytes=ctx.max_file_bytes,
        org_quota=ctx.org_max_file_bytes,
    )
    return JSONResponse(file_object(stored))


@router.get("", response_model=None, responses={200: OPENAI_LIST, **problem_responses(401)})
async def list_files(
    caller: Caller,
    ctx: ContextDep,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    after: Annotated[str | None, Query(max_length=64)] = None,
    order: Literal["asc", "desc"] = "desc",
) -> JSONResponse:
    """The caller's files, newest first, or oldest with `order=asc` (`after`: the last id of
    the page before)."""
    page = await ctx.store.files.page(
        caller, limit=limit + 1, after=after, purpose=purpose, oldest_first=order == "asc"
    )
    return JSONResponse(listing([file_object(f) for f in page[:limit]], len(page) > limit))


@router.get(
    "/{file_id}", response_model=None, responses={200: OPENAI_LIST, **problem_responses(401, 404)}
)
async def read_file(file_id: str, caller: Caller, ctx: ContextDep) -> JSONResponse:
    return JSONResponse(file_object(await ctx.store.files.get(caller, file_id)))


@router.get(
    "/{file_id}/content",
    responses={
        200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}},
        **problem_responses(401, 404),
    },
)
async def file_content(file_id: str, caller: Caller, ctx: ContextDep) -> StreamingResponse:
    """The file's bytes, streamed a chunk at a time."""
    stored = await ctx.store.files.get(caller, file_id)
    chunks: AsyncIterator[bytes] = ctx.store.files.content(caller, file_id)
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"Content-Length": str(stored.bytes)},
    )


@router.delete(
    "/{file_id}", response_model=None, responses={200: OPENAI_LIST, **problem_responses(401, 404)}
)
async def delete_file(file_id: str, caller: Caller, ctx: ContextDep) -> JSONResponse:
    await ctx.store.files.delete(caller, file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


def listing(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's cursor page: the SDK asks for the next with `after=last_id`."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
