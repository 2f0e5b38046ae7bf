"""GET /v1/responses/{id}: what a succeeded job produced."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Caller, ServicesDep
from api.problems import not_found
from api.routes.prompts import PROBLEMS
from api.schemas import ResponseOut
from projections.store import NotFound

router = APIRouter(prefix="/v1/responses", tags=["responses"])


@router.get("/{response_id}", response_model=ResponseOut, responses=PROBLEMS)
async def read_response(response_id: str, caller: Caller, services: ServicesDep) -> ResponseOut:
    try:
        return ResponseOut.of(await services.store.response(caller, response_id))
    except NotFound as err:
        raise not_found("response", response_id) from err
