"""The pure domain: the job lifecycle's vocabulary and decisions (`lifecycle`) and a chain's
placeholders (`chains`). Nothing here imports storage, I/O or anything of ours outside this
package (tests/unit/test_layering.py), so the workflow's sandbox, the activities, the
projector, the API and the CLI all decide by the same code."""
