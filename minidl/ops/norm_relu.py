"""Batch norm followed by ReLU, or by the residual addition and ReLU, as one op (always on):

    batch_norm_relu(x, ...)                = relu(batch_norm(x, ...))
    batch_norm_add_relu(x, residual, ...)  = relu(batch_norm(x, ...) + residual)

On a GPU: kernels/batchnorm.cu's sequence with the ReLU (and addition) done in registers, and
backward masking by y > 0 and writing the residual's gradient in the same pass. Elsewhere the
unfused ops' own forward and backward in the same order, so results equal theirs bit for bit.
Ghost batch norm (`group_size`) normalizes each group of images on its own, as minidl.ops.norm.
"""
from minidl.backend import get_array_module
from minidl.ops.activation import ReLU
from minidl.ops.dispatch import Op
from minidl.ops.norm import BatchNorm, GhostBatchNorm, statistics_groups


def _join(parts):
    return parts[0] if len(parts) == 1 else get_array_module(parts[0]).concatenate(parts)


class BatchNormReLU(Op):
    """relu(BN(x) [+ residual]); inputs (x, γ, β[, residual])."""

    def __init__(self, running_mean, running_var, training, momentum, eps, group_size):
        self.norm_args = running_mean, running_var, training, momentum, eps
        self.group_size = group_size

    def state_arrays(self):
        return self.norm_args[:2]

    def forward(self, x, gamma, beta, residual=None):
        self.has_residual = residual is not None
        self.groups = statistics_groups(len(x), self.norm_args[2], self.group_size)
        return super().forward(x, gamma, beta, residual)

    def forward_reference(self, x, gamma, beta, residual):
        self.norm = (BatchNorm(*self.norm_args) if len(self.groups) == 1
                     else GhostBatchNorm(self.group_size, *self.norm_args))
        z = self.norm.forward(x, gamma, beta)
        if residual is not None:
            z = z + residual
        self.relu = ReLU()
        return self.relu.forward(z)

    def backward_reference(self, gy):
        g = self.relu.backward(gy)
        gx, ggamma, gbeta = self.norm.backward(g)
        return (gx, ggamma, gbeta, g) if self.has_residual else (gx, ggamma, gbeta)

    def forward_kernels(self, kernels, x, gamma, beta, residual):
        """One kernel sequence per statistics group (image slices)."""
        outputs, self.saved = [], []
        for part in self.groups:
            y, saved = kernels.batch_norm_forward(x[part], gamma, beta, *self.norm_args,
                                                  None if residual is None else residual[part], relu=True)
            outputs.append(y)
            self.saved.append(saved)
        self.x, self.y = x, _join(outputs)
        return self.y

    def backward_kernels(self, kernels, gy):
        results = [kernels.batch_norm_backward(gy[part], self.x[part], saved, self.norm_args[2], y=self.y[part],
                                               residual_grad=self.has_residual)
                   for part, saved in zip(self.groups, self.saved)]
        gx, ggamma, gbeta, gresidual = zip(*results)
        grads = _join(gx), sum(ggamma[1:], ggamma[0]), sum(gbeta[1:], gbeta[0])
        return (*grads, _join(gresidual)) if self.has_residual else grads


def batch_norm_relu(x, gamma, beta, running_mean, running_var, training=True, momentum=0.1, eps=1e-5,
                    group_size=None):
    """relu(batch_norm(x, ...)) in one op; the arguments are minidl.ops.batch_norm's."""
    return BatchNormReLU(running_mean, running_var, training, momentum, eps, group_size)(x, gamma, beta)


def batch_norm_add_relu(x, residual, gamma, beta, running_mean, running_var, training=True, momentum=0.1, eps=1e-5,
                        group_size=None):
    """relu(batch_norm(x, ...) + residual) in one op: a residual block's end."""
    return BatchNormReLU(running_mean, running_var, training, momentum, eps, group_size)(x, gamma, beta, residual)
