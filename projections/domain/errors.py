"""The one base of every refusal: a request the service will not carry out, and why."""

from __future__ import annotations


class Refused(Exception):
    """A request refused, with a message that says what to change. Raised by the services and
    the store; each door renders the base once: the API as problem details (api/problems.py,
    OpenAI's error shape on its routes), the CLI as one line on stderr. Outages (the database,
    Temporal) are not refusals: they are waited out or answered with 503."""

    # The refusal's short machine-readable name (a problem's `code`).
    code: str = "refused"


class PromptTooLarge(Refused):
    """A prompt and its system text (they go to the provider together) over
    PROMPTJOBS_MAX_PROMPT_BYTES of UTF-8."""

    code = "prompt_too_large"

    def __init__(self, size: int, limit: int, *, with_system: bool) -> None:
        self.size = size
        self.limit = limit
        self.with_system = with_system
        super().__init__(self.worded("the prompt", "its system text"))

    def worded(self, prompt: str, system: str) -> str:
        """The message with the door's names for the prompt and the system text."""
        counted = f"{prompt} and {system} are" if self.with_system else f"{prompt} is"
        return (
            f"{counted} {self.size} bytes of UTF-8; the limit is {self.limit}: "
            f"send a shorter {prompt.removeprefix('the ')}"
        )


def check_size(text: str, system: str | None, limit: int) -> None:
    """Raise PromptTooLarge if the prompt and its system text are over `limit` bytes."""
    size = len(text.encode()) + len((system or "").encode())
    if size > limit:
        raise PromptTooLarge(size, limit, with_system=bool(system))
