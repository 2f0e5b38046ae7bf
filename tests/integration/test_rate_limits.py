"""Provider rate limits (issue 31), end to end on real processes."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from tests.conftest import eventually, free_port
from tests.integration.processes import promptjobs_process


async def test_the_mock_provider_command_enforces_its_limits(tmp_path: Path) -> None:
    port = free_port()
    args = ("--port", str(port), "--rpm", "2", "--tpm", "1000")
    with promptjobs_process("mock-provider", dict(os.environ), tmp_path, *args) as mock:

        async def printed() -> str:
            return mock.output()

        banner = await eventually(printed, lambda text: "rate limits" in text)
        assert "2 requests and 1000 tokens per sliding minute" in banner
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": "Bearer mock"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            answers = [
                await http.post("/v1/chat/completions", json=body, headers=headers)
                for _ in range(3)
            ]
        assert [a.status_code for a in answers] == [200, 200, 429]
        assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["1", "0", "0"]
        assert 0 < int(answers[2].headers["retry-after"]) <= 60
        mock.terminate()
        assert await mock.exited() == 0
