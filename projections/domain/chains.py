"""Chains of prompts: the `{{after[i]}}` / `{{after.<prompt_id>}}` placeholders a child's text
may hold, checked at submission and replaced by the parents' answers when the child starts."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from projections.domain.errors import Refused

# At most this many parents per prompt: a fan-in wider than this is a batch, not a chain.
MAX_PARENTS = 16

_PLACEHOLDER = re.compile(r"\{\{\s*after(?:\[(\d+)\]|\.([A-Za-z0-9_\-]+))\s*\}\}")
# Anything that looks like an `after` placeholder, well-formed or not.
_LOOKS_LIKE = re.compile(r"\{\{\s*after\b[^}]*\}\}")


class UnknownPlaceholder(Refused):
    """The prompt names a parent that is not in its `after` (or a malformed placeholder)."""

    code = "unknown_placeholder"

    def __init__(self, placeholder: str, reason: str) -> None:
        super().__init__(f"{placeholder}: {reason}")
        self.placeholder = placeholder
        self.reason = reason


def check_placeholders(text: str, after: Sequence[str]) -> None:
    """Raise UnknownPlaceholder for the first placeholder `after` cannot fill."""
    for found in _LOOKS_LIKE.finditer(text):
        placeholder = found.group()
        match = _PLACEHOLDER.fullmatch(placeholder)
        if match is None:
            raise UnknownPlaceholder(
                placeholder, "write {{after[0]}} (by position) or {{after.<prompt_id>}}"
            )
        index, prompt_id = match.groups()
        if index is not None and int(index) >= len(after):
            raise UnknownPlaceholder(
                placeholder, f"`after` lists {len(after)} prompt(s); positions start at 0"
            )
        if prompt_id is not None and prompt_id not in after:
            raise UnknownPlaceholder(placeholder, f"{prompt_id} is not in `after`")


def substitute(text: str, after: Sequence[str], answers: Mapping[str, str]) -> str:
    """The child's text with each placeholder replaced by that parent's answer (by prompt id)."""

    def answer(match: re.Match[str]) -> str:
        index, prompt_id = match.groups()
        return answers[after[int(index)] if index is not None else prompt_id]

    return _PLACEHOLDER.sub(answer, text)
