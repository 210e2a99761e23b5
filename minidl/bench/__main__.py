"""`python -m minidl.bench NAME [flags]` runs `minidl.bench.NAME.main(flags)`.

Each benchmark lives in its own module of this package and measures against a peer in the
same run (cuDNN, torch, the native all-reduce), printing a table and, on request, JSON.
"""
import pkgutil
import sys

import minidl.bench
from minidl.cli import run_command


def available():
    return sorted(m.name for m in pkgutil.iter_modules(minidl.bench.__path__) if not m.name.startswith("_"))


def main(argv):
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m minidl.bench {{{','.join(names)}}} [flags]  (NAME --help for its flags)")
        return 0 if argv else 2
    if argv[0] not in names:
        sys.stderr.write(f"minidl.bench: error: no benchmark {argv[0]!r}: choose one of {', '.join(names)}\n")
        return 2
    return run_command(f"minidl.bench {argv[0]}", f"minidl.bench.{argv[0]}:main", argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
