"""Benchmarks: `python -m minidl.bench NAME [flags]`, one module per NAME in this package."""
