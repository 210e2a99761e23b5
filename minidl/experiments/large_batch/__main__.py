import sys

from minidl.experiments.large_batch.cli import main

sys.exit(main())
