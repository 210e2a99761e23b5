"""Train a ResNet with minidl: `python train.py --help`, the same as `minidl-train` (its code is
minidl/train.py). Kept at the top of the repository for `mpiexec -n N python -m mpi4py train.py`."""
import sys

from minidl.train import main

if __name__ == "__main__":
    sys.exit(main(prog="train.py"))
