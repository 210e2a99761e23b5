"""Weights to and from PyTorch/torchvision as a NumPy .npz of torchvision's state dict.

Our parameter and buffer names are torchvision's, so the only differences are layout and
one buffer: convolution weights are KRSC here and KCRS (out, in, kh, kw) there, and every
torchvision BatchNorm has a `num_batches_tracked` counter. torch reads that counter only when
a BN's momentum is None (a cumulative average); ours have momentum 0.1, so it carries no
information: export writes 0 (what a freshly built torchvision model holds), import ignores it.

    export_torchvision(model, "r50.npz")
    # in PyTorch:
    tv_model.load_state_dict({k: torch.from_numpy(v) for k, v in numpy.load("r50.npz").items()})

    numpy.savez("r50.npz", **{k: v.numpy() for k, v in tv_model.state_dict().items()})
    import_torchvision(model, "r50.npz")

Every 4-D array is a convolution weight (true of the whole model zoo); others keep their layout.
"""
import io
import zipfile
from pathlib import Path

import numpy

from minidl.backend import to_numpy
from minidl.errors import UserError
from minidl.fileio import write_bytes_atomic
from minidl.nn import BatchNorm2d

TO_KCRS, TO_KRSC = (0, 3, 1, 2), (0, 2, 3, 1)
MISMATCH_FIX = "export it from a torchvision model of the same architecture and number of classes"


def _counter_names(model):
    return [f"{prefix}num_batches_tracked" for prefix, module in model.named_modules()
            if isinstance(module, BatchNorm2d)]


def _relayout(array, axes):
    return array.transpose(axes) if array.ndim == 4 else array


def export_torchvision(model, path):
    """Write the model's parameters and buffers to `path` (.npz, float32, torchvision's names
    and layouts), atomically."""
    state = {name: numpy.ascontiguousarray(_relayout(to_numpy(array), TO_KCRS), dtype=numpy.float32)
             for name, array in model.state_dict().items()}
    state.update((name, numpy.array(0, dtype=numpy.int64)) for name in _counter_names(model))
    image = io.BytesIO()
    numpy.savez(image, **state)
    write_bytes_atomic(path, image.getbuffer())


def _read_npz(path):
    if not Path(path).is_file():
        raise UserError(f"weights file {path} does not exist: pass the path of an .npz that "
                        "export_torchvision or numpy.savez wrote")
    try:
        with numpy.load(path) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, TypeError, zipfile.BadZipFile, EOFError) as error:  # TypeError: a .npy
        raise UserError(f"weights file {path} is not a readable .npz ({' '.join(str(error).split())}): "
                        "write it with numpy.savez from a torchvision state dict")


def import_torchvision(model, path):
    """Load torchvision-named weights from an .npz into `model` in place (views into an
    optimizer's flat buffer stay valid). Raises UserError naming the first missing or
    unexpected name, or the first shape that does not fit."""
    found = _read_npz(path)
    for name in _counter_names(model):
        found.pop(name, None)
    own = model.state_dict()
    missing = [name for name in own if name not in found]
    if missing:
        raise UserError(f"weights file {path} lacks {missing[0]} ({len(missing)} missing in all): {MISMATCH_FIX}")
    unexpected = [name for name in found if name not in own]
    if unexpected:
        raise UserError(f"weights file {path} has {unexpected[0]}, which this model does not "
                        f"({len(unexpected)} unexpected in all): {MISMATCH_FIX}")
    for name, array in own.items():
        expected = _relayout(array, TO_KCRS).shape
        if found[name].shape != expected:
            raise UserError(f"weights file {path} has {name} of shape {list(found[name].shape)} where this "
                            f"model needs {list(expected)} (torch layout): {MISMATCH_FIX}")
    model.load_state_dict({name: _relayout(array, TO_KRSC).astype(own[name].dtype) for name, array in found.items()})
