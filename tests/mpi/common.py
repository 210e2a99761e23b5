"""What the dist tests share: a record of failed checks that rank 0 reports for all ranks, and
a model whose gradients arrive in an awkward order."""
import sys

import numpy as np

from minidl import nn, ops


class TiedNet(nn.Module):
    """conv → pool → fc → relu → fc → head: `fc` gets two gradient contributions per backward,
    with another layer's backward in between; `spare` is never used (it gets none)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 8)
        self.spare = nn.Linear(8, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        h = ops.global_avg_pool(ops.relu(self.conv(x)))
        return self.head(self.fc(ops.relu(self.fc(h))))


class Checks:
    def __init__(self, comm):
        self.comm, self.failures, self.count = comm, [], 0

    def true(self, ok, what):
        self.count += 1
        if not ok:
            self.failures.append(what)

    def equal(self, actual, expected, what):
        """Bit-for-bit equality of two arrays."""
        self.true(np.array_equal(np.asarray(actual), np.asarray(expected)), what)

    def close(self, actual, expected, what, rtol, atol=0.0):
        self.true(np.allclose(actual, expected, rtol=rtol, atol=atol), what)

    def raises(self, error, text, function, what):
        """`function()` must raise `error` whose message contains `text`."""
        try:
            function()
        except error as raised:
            self.true(text in str(raised), f"{what}: message {raised}")
        else:
            self.true(False, f"{what}: no {error.__name__}")

    def finish(self):
        """Rank 0 prints every rank's failures, then 'passed N checks'; exit 1 if any failed."""
        failures = self.comm.allgather_object(self.failures)
        counts = self.comm.allgather_object(self.count)
        if self.comm.rank == 0:
            for rank, messages in enumerate(failures):
                for message in messages:
                    print(f"rank {rank}: FAILED {message}")
            print(f"{self.comm.size} ranks passed {sum(counts)} checks" if not any(failures) else "FAILED")
        sys.stdout.flush()
        sys.exit(1 if any(failures) else 0)
