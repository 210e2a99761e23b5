"""`python -m minidl.figures [DIR]`: redraw every picture into DIR (default docs/figures), the
overlap from DIR/trace.json; prints the paths it wrote."""
import sys
from pathlib import Path

from minidl.cli import run_command
from minidl.errors import UserError

DEFAULT_DIR = Path("docs") / "figures"
TRACE = "trace.json"  # a --trace-steps trace, the overlap picture's input (docs/figures/README.md)


def draw(argv):
    from minidl.figures import gemm, overlap, schedule, torus
    from minidl.figures.style import save
    from minidl.fileio import writable
    if len(argv) > 1 or any(a.startswith("-") for a in argv):
        raise UserError(f"usage: python -m minidl.figures [DIR] (got {' '.join(argv)}): one folder, "
                        f"default {DEFAULT_DIR}")
    folder = writable("DIR", argv[0] if argv else DEFAULT_DIR, folder=True)
    trace = folder / TRACE
    if not trace.exists():
        raise UserError(f"{trace} is missing: the overlap is drawn from a traced step; make one with "
                        "the command in docs/figures/README.md and copy its trace.json there")
    drawings = {"gemm_tiling.png": gemm.tiling_figure, "smem_swizzle.png": gemm.swizzle_figure,
                "torus_stages.png": torus.torus_figure, "bucket_overlap.png": lambda: overlap.overlap_figure(trace),
                "sony_schedule.png": schedule.schedule_figure}
    for name, figure in drawings.items():
        print(save(figure(), folder / name))


def main(argv=None):
    return run_command("minidl.figures", "minidl.figures.__main__:draw", sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
