"""Benchmark harness for daskcfa (see benchmarks/README.md)."""
