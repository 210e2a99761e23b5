"""The optional bias of the convolution and linear ops: one value per output channel (the
last axis of NHWC and of (rows, features) alike)."""


def add_bias(y, b):
    """y + b in place (b None: y unchanged)."""
    if b is not None:
        y += b
    return y


def with_bias_grad(gy, has_bias, gx, gw):
    """(gx, gw) and, for a layer with a bias, its gradient: gy summed over all but the channel axis."""
    if not has_bias:
        return gx, gw
    return gx, gw, gy.reshape(-1, gy.shape[-1]).sum(axis=0)
