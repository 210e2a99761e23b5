"""The Slurm tests: a one-node cluster made once per session (cluster.py, conftest.py), jobs submitted to it."""
