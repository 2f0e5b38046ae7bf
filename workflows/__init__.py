"""Job lifecycles on Temporal: one PromptJobWorkflow per job, deterministic."""
