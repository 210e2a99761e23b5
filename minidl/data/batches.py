"""Making batches: decode and augment a batch's images straight into a slot of a buffer ring.

Randomness is keyed, not streamed: sample i's augmentation in an epoch comes from
default_rng([seed, epoch, i]), so a batch's pixels are the same whoever makes it, whatever the
number of worker processes or ranks.

A `Producer` turns a list of batches (index arrays) into `Filled` slots, in order; whoever
consumes a slot gives it back with `release(slot)`. `InProcess` makes them in the calling
process; `workers.WorkerPool` in worker processes that write into the same ring.
"""

import collections
import mmap

import numpy as np

from minidl.data.images import BadImage

# A made batch: its ring slot, its images (a view into the slot: the first len(labels) rows),
# labels, and one message per image skipped because it could not be decoded.
Filled = collections.namedtuple("Filled", "slot images labels skipped")


class Ring:
    """`slots` buffers of `batch_size` uint8 images each, in one anonymous shared mapping.

    The mapping is MAP_SHARED: processes forked after it was made write into the very pages
    the parent reads, so no image data is pickled or copied between processes. It is
    page-aligned, as registering it with CUDA as pinned memory requires. It is unmapped when
    the last reference to it goes, in every process.
    """

    def __init__(self, slots, batch_size, image_shape):
        shape = (slots, batch_size, *image_shape)
        self.images = np.frombuffer(mmap.mmap(-1, max(1, int(np.prod(shape)))), np.uint8,
                                    count=int(np.prod(shape))).reshape(shape)

    def __len__(self):
        return len(self.images)


def fill_batch(dataset, transform, seed, epoch, indices, out, stopped=lambda: False):
    """Decode and augment dataset[indices] into out[0], out[1], ...; skip undecodable images.

    Returns (labels of the images written, messages naming the images skipped), or None if
    `stopped()` turned true on the way.
    """
    labels, skipped = [], []
    for i in indices:
        if stopped():
            return None
        try:
            image, label = dataset[i]
            array = transform(image, np.random.default_rng([seed, epoch, i]))
        except BadImage as e:
            skipped.append(f"{dataset.source(i)}: {e}")
            continue
        out[len(labels)] = array
        labels.append(label)
    return np.array(labels, dtype=np.int64), skipped


class Producer:
    """Hands out the free slots of a ring; subclasses fill them (`batches`) and stop (`close`)."""

    def __init__(self, ring):
        self.ring = ring
        self.free = collections.deque(range(len(ring)))

    def release(self, slot):
        self.free.append(slot)

    def filled(self, slot, labels, skipped):
        return Filled(slot, self.ring.images[slot, :len(labels)], labels, skipped)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class InProcess(Producer):
    """Makes each batch in the calling process when it is asked for."""

    def __init__(self, ring, dataset, transform, seed):
        super().__init__(ring)
        self.args = dataset, transform, seed

    def batches(self, epoch, batches):
        dataset, transform, seed = self.args
        for indices in batches:
            slot = self.free.popleft()
            made = fill_batch(dataset, transform, seed, epoch, indices, self.ring.images[slot])
            yield self.filled(slot, *made)
