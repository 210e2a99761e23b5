"""The seam between an operation and its two implementations.

An `Op` is a Function with a reference implementation (xp code: the CPU path, and the oracle of
the kernels) and a kernel implementation (minidl.kernels). `forward` asks `kernels.serving` —
the one rule of which implementation runs — once per call, about the op's input arrays and the
arrays it holds itself (`state_arrays`, e.g. BN's running statistics), and keeps the answer:
`backward` runs the implementation its forward ran, whatever it is handed.
"""
from minidl import kernels
from minidl.autograd import Function


class Op(Function):
    def state_arrays(self):
        """Arrays besides the inputs that the kernels would read or write (None entries allowed)."""
        return ()

    def forward(self, *arrays):
        self.kernels = kernels.serving(*arrays, *self.state_arrays())
        if self.kernels is None:
            return self.forward_reference(*arrays)
        return self.forward_kernels(self.kernels, *arrays)

    def backward(self, *grads):
        if self.kernels is None:
            return self.backward_reference(*grads)
        return self.backward_kernels(self.kernels, *grads)

    def forward_reference(self, *arrays):
        raise NotImplementedError

    def backward_reference(self, *grads):
        raise NotImplementedError

    def forward_kernels(self, kernels, *arrays):
        raise NotImplementedError

    def backward_kernels(self, kernels, *grads):
        raise NotImplementedError
