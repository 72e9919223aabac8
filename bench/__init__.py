"""Benchmarks that ship with trimproxy (run from the repository root)."""
