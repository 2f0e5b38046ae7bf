"""Identifiers of prompts, jobs and responses."""

from __future__ import annotations

import hashlib
import uuid


def new_prompt_id() -> str:
    return f"pmt_{uuid.uuid4().hex}"


def new_job_id() -> str:
    return f"job_{uuid.uuid4().hex}"


def response_id_for(job_id: str) -> str:
    """Derived, not random: a repeated write of a job's result collides instead of
    duplicating. From the job alone: a job keeps one answer, and the provider's request id,
    which providers repeat (Ollama's `/v1` counts to 998), can never join two jobs' answers.
    Responses written before this rule keep the ids they were given."""
    return f"rsp_{hashlib.sha256(f'response:{job_id}'.encode()).hexdigest()[:32]}"
