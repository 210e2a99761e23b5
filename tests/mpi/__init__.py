"""Scripts that the dist tests (tests/test_dist_*.py) run under mpiexec, and how they run them."""
