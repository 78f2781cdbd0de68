"""Benchmark workloads and harness."""
