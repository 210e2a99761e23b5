"""Input pipeline: image folders, the embedded dataset, transforms and the batch loader."""

from minidl.data.embedded import EMBEDDED_CLASSES, make_embedded_dataset
from minidl.data.folder import FolderDataset, check_folder_layout
from minidl.data.loader import DataLoader
from minidl.data.transforms import (IMAGENET_MEAN, IMAGENET_STD, TRAIN_TRANSFORMS,
                                    build_transform, build_val_transform, normalize)

__all__ = ["EMBEDDED_CLASSES", "IMAGENET_MEAN", "IMAGENET_STD", "TRAIN_TRANSFORMS",
           "DataLoader", "FolderDataset", "build_transform", "build_val_transform",
           "check_folder_layout", "make_embedded_dataset", "normalize"]
