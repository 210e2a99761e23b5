"""minidl: a transparent, from-scratch deep learning engine for large-minibatch training."""
from minidl import ops
from minidl.autograd import Function, Tensor, no_grad
from minidl.backend import to_numpy, xp
from minidl.nn import manual_seed

__all__ = ["Function", "Tensor", "manual_seed", "no_grad", "ops", "to_numpy", "xp"]
