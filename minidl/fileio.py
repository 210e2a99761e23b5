"""Files that survive crashes: whole-file writes are atomic (temp file, fsync, rename), so a
reader sees the old version or the new one, never half of either."""
import json
import os
import tempfile
from pathlib import Path


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
