"""The custom search attributes every job's workflow carries, for the Temporal Web UI."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

JOB_STATE = SearchAttributeKey.for_keyword("PromptJobState")
ORG = SearchAttributeKey.for_keyword("PromptJobOrg")
PROMPT_ID = SearchAttributeKey.for_keyword("PromptJobPromptId")
PRIORITY = SearchAttributeKey.for_int("PromptJobPriority")
ERROR_KIND = SearchAttributeKey.for_keyword("PromptJobErrorKind")
ATTEMPT = SearchAttributeKey.for_int("PromptJobAttempt")

ALL = (JOB_STATE, ORG, PROMPT_ID, PRIORITY, ERROR_KIND, ATTEMPT)


def dev_server_flags() -> list[str]:
    """`--search-attribute Name=Type` for `temporal server start-dev`."""
    flags: list[str] = []
    for key in ALL:
        kind = "Int" if key.indexed_value_type.name.endswith("INT") else "Keyword"
        flags += ["--search-attribute", f"{key.name}={kind}"]
    return flags
