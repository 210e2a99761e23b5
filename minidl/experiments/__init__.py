"""Experiments that reproduce, at small scale, what the papers report: `python -m minidl.experiments.NAME`."""
