"""Input pipeline: image folders and HDF5 shards, the distributed sampler, the parallel loader,
transforms and the embedded dataset. See loader.py for how the pieces fit."""

from minidl.data.datasets import open_dataset
from minidl.data.embedded import EMBEDDED_CLASSES, make_embedded_dataset
from minidl.data.folder import FolderDataset, check_folder_layout
from minidl.data.hdf5 import HDF5Dataset
from minidl.data.images import BadImage
from minidl.data.loader import BadImageWarning, DataLoader
from minidl.data.sampler import DistributedSampler
from minidl.data.transforms import (IMAGENET_MEAN, IMAGENET_STD, TRAIN_TRANSFORMS,
                                    build_transform, build_val_transform, normalize)

__all__ = ["EMBEDDED_CLASSES", "IMAGENET_MEAN", "IMAGENET_STD", "TRAIN_TRANSFORMS",
           "BadImage", "BadImageWarning", "DataLoader", "DistributedSampler", "FolderDataset",
           "HDF5Dataset", "build_transform", "build_val_transform", "check_folder_layout",
           "make_embedded_dataset", "normalize", "open_dataset"]
