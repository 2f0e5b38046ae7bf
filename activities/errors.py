"""The adapters' one exception: a provider call failed, and of which kind."""

from __future__ import annotations

from projections.domain.lifecycle import ErrorKind


class AdapterError(Exception):
    """A provider call failed; `kind` says how, `retry_after_s` is the provider's own hint."""

    def __init__(self, kind: ErrorKind, message: str, *, retry_after_s: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s
