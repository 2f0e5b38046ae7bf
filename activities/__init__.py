"""Side effects of a job: the adapter call with heartbeats, projection writes, the response."""
