"""Temporal's priority and fairness keys, as promptjobs sets them on what it starts."""

from __future__ import annotations

import hashlib

from temporalio.common import Priority

# Temporal refuses a start whose fairness key is longer than this (in UTF-8 bytes).
FAIRNESS_KEY_BYTES = 64


def temporal_priority(priority: int, org: str) -> Priority:
    """Our 0 (most urgent) … 100 onto Temporal's priority keys 1 … 101 (1 is first), one key
    per priority; the org is the fairness key, so one org's burst cannot starve another's."""
    return Priority(priority_key=1 + min(100, max(0, priority)), fairness_key=fairness_key(org))


def fairness_key(org: str) -> str:
    """The org itself while it fits Temporal's limit; else as much of it as fits beside a
    digest of the whole (distinct orgs keep distinct keys, and the key stays readable)."""
    whole = org.encode()
    if len(whole) <= FAIRNESS_KEY_BYTES:
        return org
    digest = "~" + hashlib.sha256(whole).hexdigest()[:16]
    head = whole[: FAIRNESS_KEY_BYTES - len(digest)].decode(errors="ignore")
    return head + digest
