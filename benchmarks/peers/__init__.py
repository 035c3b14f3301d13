"""Benchmark peers; each module is a standalone runner executed in a fresh process."""
