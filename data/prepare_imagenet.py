#!/usr/bin/env python3
"""Pack an ImageNet-layout folder into HDF5 shards: `python data/prepare_imagenet.py --help`, the
same as `minidl-prepare-imagenet` (its code is minidl/data/prepare_imagenet.py)."""
import sys

from minidl.data import prepare_imagenet


def main(argv=None):
    return prepare_imagenet.main(argv, prog="prepare_imagenet.py")


if __name__ == "__main__":
    sys.exit(main())
