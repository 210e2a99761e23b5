"""Weights to and from PyTorch/torchvision as a NumPy .npz of torchvision's state dict.

Parameter and buffer names are torchvision's, so only layout and one buffer differ:
convolution weights are KRSC here and KCRS there (every 4-D array is one), and the
`num_batches_tracked` counter of torchvision's BatchNorm, which carries no information at
momentum 0.1, is written as 0 on export and ignored on import.

Details: docs/design.md, "minidl/models/interop.py".
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
