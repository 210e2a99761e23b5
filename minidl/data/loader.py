"""Batches of decoded, augmented uint8 images, on the host or (asynchronously) on the GPU.

Order comes from the sampler, augmentation from (seed, epoch, index): the batches are the
same for any number of workers. An undecodable image is skipped and counted in
`loader.skipped`; its batch comes out that much smaller, labels still matching, and is never
dropped, so every rank makes the same number of steps. Images are made into a ring of shared
batch buffers; with `to_device=True` (CuPy) they arrive as a CuPy array, copied one batch ahead.

Details: docs/data.md, "minidl/data/loader.py".
"""

import warnings

from minidl.data.batches import InProcess, Ring
from minidl.data.sampler import DistributedSampler
from minidl.data.workers import WorkerPool
from minidl.intmath import ceil_div


class BadImageWarning(UserWarning):
    """An image was skipped because it cannot be decoded."""


class DataLoader:
    """Iterate over one epoch of `dataset` for this rank (see the module's docstring).

    `dataset[i]` gives (PIL image, label) or raises images.BadImage; `transform(image, rng)`
    gives a uint8 array of shape `transform.output_shape`. `sampler` (a DistributedSampler)
    chooses the indices; without one the loader reads the whole dataset, shuffled by `seed`
    if `shuffle`. `seed` also keys the augmentation. `drop_last` drops this rank's last batch
    if it is not full. `workers` processes make the batches (0: the calling process does),
    at most `prefetch` batches each ahead of the consumer. `to_device=True` yields the images
    as CuPy arrays (see the module's docstring).
    """

    def __init__(self, dataset, batch_size, transform, shuffle=False, seed=0, workers=0,
                 drop_last=False, sampler=None, prefetch=2, to_device=False):
        self.dataset = dataset
        self.batch_size = batch_size
        self.transform = transform
        self.seed = seed
        self.workers = workers
        self.drop_last = drop_last
        self.sampler = (DistributedSampler(len(dataset), seed=seed, shuffle=shuffle)
                        if sampler is None else sampler)
        self.prefetch = prefetch
        self.to_device = to_device
        self.epoch, self.start_batch = 0, 0
        self.skipped = 0
        self._producer = None

    def set_epoch(self, epoch, start_batch=0):
        """Choose the epoch whose order and augmentations the next iteration produces, and the
        batch it starts from (a run resumed mid-epoch skips those before, reading none of them)."""
        self.epoch, self.start_batch = epoch, start_batch
        self.sampler.set_epoch(epoch)
        self.skipped = 0

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return ceil_div(len(self.sampler), self.batch_size)

    def _batches(self):
        indices = self.sampler.indices()
        return [indices[b * self.batch_size:(b + 1) * self.batch_size] for b in range(self.start_batch, len(self))]

    def __iter__(self):
        self.skipped = 0
        ring = Ring(max(2, self.workers * self.prefetch), self.batch_size,
                    self.transform.output_shape)
        args = self.dataset, self.transform, self.seed
        producer = WorkerPool(ring, self.workers, *args) if self.workers else InProcess(ring, *args)
        self._producer = producer
        with producer:  # stops the workers however the iteration ends
            filled = producer.batches(self.epoch, self._batches())
            if self.to_device:
                yield from self._device_batches(producer, filled)
            else:
                yield from self._host_batches(producer, filled)

    def close(self):
        """Stop the workers of the iteration in progress, if any (iterating again restarts)."""
        if self._producer is not None:
            self._producer.close()

    def _host_batches(self, producer, filled):
        for batch in filled:
            images = batch.images.copy()  # the slot goes back to the workers
            producer.release(batch.slot)
            self._count_skipped(batch.skipped)
            yield images, batch.labels

    def _device_batches(self, producer, filled):
        """Start each batch's copy to the GPU one batch before it is yielded."""
        from minidl.data.device import DeviceCopier
        copier = DeviceCopier(producer.ring.images)
        try:
            ahead = None
            for batch in filled:
                started = (batch, *copier.start(batch.images))
                if ahead is not None:
                    yield self._arrived(producer, copier, *ahead)
                ahead = started
            if ahead is not None:
                yield self._arrived(producer, copier, *ahead)
        finally:
            copier.close()

    def _arrived(self, producer, copier, batch, images, copied):
        copier.wait(copied)
        producer.release(batch.slot)
        self._count_skipped(batch.skipped)
        return images, batch.labels

    def _count_skipped(self, messages):
        self.skipped += len(messages)
        for message in messages:
            warnings.warn(f"skipped an image that cannot be decoded: {message}", BadImageWarning)
