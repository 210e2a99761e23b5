"""Batches of decoded, augmented images, optionally made by a pool of worker processes.

Randomness is keyed, not streamed: the epoch's order comes from default_rng([seed, epoch]) and
sample i's augmentation from default_rng([seed, epoch, i]). Batches are therefore the same
whatever the number of workers and whichever worker makes them.
"""

import collections
import multiprocessing
import signal

import numpy as np


def _load_batch(dataset, transform, seed, epoch, indices):
    images, labels = [], []
    for i in indices:
        image, label = dataset[i]
        images.append(transform(image, np.random.default_rng([seed, epoch, i])))
        labels.append(label)
    return np.stack(images), np.array(labels, dtype=np.int64)


# A worker's copy of (dataset, transform, seed), set once when the worker starts, so that
# tasks carry only an epoch and a few indices.
_worker_args = None


def _init_worker(dataset, transform, seed):
    global _worker_args
    _worker_args = (dataset, transform, seed)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _worker_load_batch(epoch, indices):
    dataset, transform, seed = _worker_args
    return _load_batch(dataset, transform, seed, epoch, indices)


class DataLoader:
    """Iterate (images uint8 (B, H, W, 3), labels int64 (B,)) over one epoch of `dataset`.

    `dataset[i]` gives (PIL image, label); `transform(image, rng)` gives a uint8 HWC array.
    """

    def __init__(self, dataset, batch_size, transform, shuffle=False, seed=0, workers=0,
                 drop_last=False):
        self.dataset = dataset
        self.batch_size = batch_size
        self.transform = transform
        self.shuffle = shuffle
        self.seed = seed
        self.workers = workers
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch):
        """Choose the epoch whose order and augmentations the next iteration produces."""
        self.epoch = epoch

    def __len__(self):
        if self.drop_last:
            return len(self.dataset) // self.batch_size
        return -(-len(self.dataset) // self.batch_size)

    def _batch_indices(self):
        n = len(self.dataset)
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(n)
                 if self.shuffle else np.arange(n))
        return [order[b * self.batch_size:(b + 1) * self.batch_size] for b in range(len(self))]

    def __iter__(self):
        batches = self._batch_indices()
        if self.workers == 0:
            for indices in batches:
                yield _load_batch(self.dataset, self.transform, self.seed, self.epoch, indices)
        else:
            yield from self._pool_iter(batches)

    def _pool_iter(self, batches):
        """Yield the batches in order, at most 2 per worker in flight."""
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else None)
        pool = context.Pool(self.workers, _init_worker,
                            (self.dataset, self.transform, self.seed))
        try:
            pending = collections.deque()
            for indices in batches:
                pending.append(pool.apply_async(_worker_load_batch, (self.epoch, indices)))
                if len(pending) == 2 * self.workers:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()
        finally:
            # Also reached when the consumer stops early or a worker raised: no orphans.
            pool.terminate()
            pool.join()
