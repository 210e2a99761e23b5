import sys

from minidl.cli import run_command
from minidl.experiments.large_batch import PROG

sys.exit(run_command(PROG, "minidl.experiments.large_batch.cli:study_command", sys.argv[1:]))
