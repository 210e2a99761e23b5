"""Files that survive crashes: whole-file writes are atomic (temp file, fsync, rename), so a
reader sees the old version or the new one, never half of either. And whether a path a user
gave can be written, asked before the work whose results go there."""
import json
import os
import tempfile
from pathlib import Path

from minidl.errors import UserError


def write_bytes_atomic(path, data):
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _umask():
    current = os.umask(0)
    os.umask(current)
    return current


def write_json_atomic(path, obj):
    write_bytes_atomic(path, (json.dumps(obj, indent=1) + "\n").encode())


def append_json_line(path, obj):
    """Append one JSON object as a line and flush it to disk (a log that survives a crash)."""
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()
        os.fsync(f.fileno())


def why_not_writable(path, folder=False):
    """Why no file can be written at `path` (with `folder`: into the folder `path`), in a few
    words; None where one can. The folder is made, with its parents, where it is missing, and
    a probe file made in it and removed: os.access cannot tell for root or a read-only mount."""
    path = Path(path)
    into = path if folder else path.parent
    if not folder and path.is_dir():
        return "is a folder"
    existing = next(ancestor for ancestor in (into, *into.parents) if ancestor.exists())
    if not existing.is_dir():
        return "is a file" if existing == path else f"is inside {existing}, which is a file"
    try:
        into.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=into).close()
    except OSError as error:
        return f"cannot be written ({error.strerror})"
    return None


def writable(flag, path, folder=False):
    """`path` as a Path where `why_not_writable` finds nothing wrong; else a UserError naming
    the flag that gave it, the problem and the fix."""
    reason = why_not_writable(path, folder)
    if reason:
        raise UserError(f"{flag} {path} {reason}: choose a {'folder' if folder else 'file'} you can write to")
    return Path(path)
