"""The request body limit: an oversized body is refused with a 413 problem before it is read."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import Problem, problem_response


def too_large_detail(max_bytes: int, prompt_bytes: int) -> str:
    return (
        f"the request body is over {max_bytes:,} bytes, far past what the largest prompt "
        f"needs: a prompt and its options.system may be {prompt_bytes:,} bytes of UTF-8 "
        "together (PROMPTJOBS_MAX_PROMPT_BYTES); send a shorter prompt"
    )


FILES_PATH = "/v1/files"
# A multipart upload's parts and headers around the file itself.
FORM_OVERHEAD_BYTES = 64 * 1024


class BodyLimit:
    """A declared Content-Length over the limit is answered at once; a streamed body is cut
    off as soon as it passes the limit (and the handler renders that as the same problem)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, prompt_bytes: int, file_bytes: int | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.prompt_bytes = prompt_bytes
        # POST /v1/files (OpenAI's Files API) has its own limit and checks it as it reads.
        self.file_bytes = file_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, detail = self.max_bytes, self._detail
        if self.file_bytes is not None and scope["path"] == FILES_PATH:
            limit = self.file_bytes + FORM_OVERHEAD_BYTES
            detail = (
                f"the upload is over {self.file_bytes:,} bytes, the largest file this server "
                "takes (PROMPTJOBS_MAX_FILE_BYTES): split the batch into smaller files"
            )
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            problem = Problem(413, "body_too_large", "Content too large", detail)
            await problem_response(problem, Request(scope))(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, detail=detail)
            return message

        await self.app(scope, receive_within_limit, send)

    @property
    def _detail(self) -> str:
        return too_large_detail(self.max_bytes, self.prompt_bytes)
