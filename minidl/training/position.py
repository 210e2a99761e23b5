"""Where a run is, and what the current epoch has summed so far: what a checkpoint must hold
to continue exactly."""
import dataclasses


@dataclasses.dataclass
class Position:
    epoch: int = 0       # epochs completed
    step: int = 0        # optimizer steps done in the current epoch
    iteration: int = 0   # optimizer steps done in all

    def advance(self):
        self.step += 1
        self.iteration += 1

    def next_epoch(self):
        self.epoch, self.step = self.epoch + 1, 0


@dataclasses.dataclass
class EpochTotals:
    """This rank's sums over the current epoch's training micro-batches."""
    loss_sum: float = 0.0  # Σ loss × images
    images: int = 0
    skipped: int = 0       # undecodable images

    def to_dict(self):
        return dataclasses.asdict(self)

    def reset(self):
        self.assign(EpochTotals())

    def assign(self, other):
        """Take `other`'s values (whoever holds this object sees them)."""
        self.loss_sum, self.images, self.skipped = other.loss_sum, other.images, other.skipped
