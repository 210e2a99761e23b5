"""Scripts that the dist tests (tests/distributed/test_dist_*.py) run under mpiexec, and how they run them."""
