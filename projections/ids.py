"""Identifiers of prompts, jobs and responses."""

from __future__ import annotations

import hashlib
import uuid


def new_prompt_id() -> str:
    return f"pmt_{uuid.uuid4().hex}"


def new_job_id() -> str:
    return f"job_{uuid.uuid4().hex}"


def response_id_for(prompt_id: str, provider_request_id: str | None, job_id: str) -> str:
    """Derived, not random: a repeated write of one result collides instead of duplicating."""
    source = f"{prompt_id}:{provider_request_id or job_id}"
    return f"rsp_{hashlib.sha256(source.encode()).hexdigest()[:32]}"
