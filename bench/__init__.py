"""Benchmarks against the seed's success criteria and bare Temporal; not part of the tests."""
