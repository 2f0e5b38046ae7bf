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
