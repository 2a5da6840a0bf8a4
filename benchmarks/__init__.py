"""Regression benchmarks (pytest-benchmark). A package, so that its conftest never shadows tests/conftest.py when
both folders run in one session."""
