"""Which samples each rank reads in an epoch (Goyal et al. 2017, remark 4).

Every epoch draws ONE permutation of the whole dataset from (seed, epoch), the same on every
rank, and deals it out: rank r takes positions r, r + W, r + 2W, ... (W ranks); the tail is
dropped or padded so that all ranks run the same number of steps. A step of global batch G
then reads the next G positions whatever W, so a run resumed on another number of ranks reads
exactly what was left. `pad=False` (evaluation) reads every sample exactly once.

Details: docs/data.md, "minidl/data/sampler.py".
"""

import numpy as np

from minidl.intmath import round_up


class DistributedSampler:
    """Iterate over this rank's dataset indices for the epoch chosen by `set_epoch`."""

    def __init__(self, size, rank=0, world_size=1, seed=0, shuffle=True, drop_last=False,
                 pad=True):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.size = size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.pad = pad
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def _total(self):
        """How many positions of the (padded or cut) permutation the ranks share."""
        if self.drop_last:
            return self.size - self.size % self.world_size
        if self.pad:
            return round_up(self.size, self.world_size)
        return self.size

    def __len__(self):
        return len(range(self.rank, self._total(), self.world_size))

    def indices(self):
        """This rank's indices for the current epoch, as an int64 array."""
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(self.size)
                 if self.shuffle else np.arange(self.size))
        total = self._total()
        if total > self.size:  # pad by wrapping around (np.resize repeats the array)
            order = np.resize(order, total)
        return order[self.rank:total:self.world_size]

    def __iter__(self):
        return iter(self.indices().tolist())
