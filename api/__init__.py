"""The HTTP API: submit, read, poll, stream, cancel and retry jobs, scoped to the caller's org."""
