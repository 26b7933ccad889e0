"""Benchmarks (`kvd bench ...`). Each prints a ratio against a baseline measured in the same run."""
