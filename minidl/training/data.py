"""The run's data: the training and validation sets (the embedded dataset generated on first
use, by one rank) and their loaders, each rank reading its share."""
from pathlib import Path

from minidl.backend import on_gpu
from minidl.data import DataLoader, DistributedSampler, build_transform, build_val_transform, open_dataset
from minidl.data import make_embedded_dataset

EMBEDDED_DATASET_SEED = 0  # the embedded dataset is fixed; --seed varies the run, not the data


class RunData:
    def __init__(self, config, comm):
        self.config, self.comm = config, comm
        self.root = self._dataset_root()
        self.train_set, self.val_set = open_dataset(self.root, "train"), open_dataset(self.root, "val")
        self.train_transform = build_transform(config.augment, config.train_crop_size)
        self._train_loader = None

    def _dataset_root(self):
        if self.config.data_path:
            return Path(self.config.data_path)
        root = Path(self.config.cache_dir) / "embedded"
        if self.comm.rank == 0:  # one rank generates, the others wait for it
            make_embedded_dataset(root, seed=EMBEDDED_DATASET_SEED)
        self.comm.barrier()
        return root

    def describe(self):
        return f"{len(self.train_set):,} images of {len(self.train_set.classes)} classes from {self.root}"

    def train_loader(self, micro_batch):
        """The training loader (one permutation per epoch dealt out to the ranks), rebuilt only
        when batch-size control changes the micro-batch."""
        if self._train_loader is None or self._train_loader.batch_size != micro_batch:
            config, comm = self.config, self.comm
            sampler = DistributedSampler(len(self.train_set), comm.rank, comm.size, config.seed, shuffle=True,
                                         drop_last=True)
            self._train_loader = DataLoader(self.train_set, micro_batch, self.train_transform, seed=config.seed,
                                            workers=config.workers, drop_last=True, sampler=sampler, to_device=on_gpu)
        return self._train_loader

    def val_loader(self, batch):
        """Every validation image once, over all ranks."""
        config, comm = self.config, self.comm
        sampler = DistributedSampler(len(self.val_set), comm.rank, comm.size, shuffle=False, pad=False)
        return DataLoader(self.val_set, batch, build_val_transform(config.val_resize_size, config.val_crop_size),
                          workers=config.workers, sampler=sampler, to_device=on_gpu)
