"""Benchmarks and evaluations of Memories (see bench/README.md); run each from the repository root as
``.venv/bin/python -m bench.NAME``."""
