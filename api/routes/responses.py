"""GET /v1/responses/{id}: what a succeeded job produced."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Caller, ServicesDep
from api.problems import problem_responses
from api.schemas import ResponseOut

router = APIRouter(prefix="/v1/responses", tags=["responses"])


@router.get("/{response_id}", response_model=ResponseOut, responses=problem_responses(401, 404))
async def read_response(response_id: str, caller: Caller, services: ServicesDep) -> ResponseOut:
    return ResponseOut.of(await services.store.response(caller, response_id))
