"""The adapters' one exception: a provider call failed, and of which kind."""

from __future__ import annotations

from typing import Any

from projections.domain.lifecycle import ErrorKind, Reason


class AdapterError(Exception):
    """A provider call failed; `kind` says how, `retry_after_s` is the provider's own hint,
    `detail` what the attempt's record keeps of it (a schema miss: the answer and why)."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        retry_after_s: float | None = None,
        detail: dict[str, Any] | None = None,
        reason: Reason | None = None,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s
        self.detail = detail
        # A client error that another place may not make (the model gone, a context window
        # too small): the job moves on to its next place, if it has one.
        self.reason = reason
