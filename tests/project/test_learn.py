"""Every stop of docs/learn.md runs: its one command exits 0 within a minute."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STOP = re.compile(r"^## (Stop \d+\..*?)$(.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)
COMMAND = re.compile(r"^```bash\n(.*?)\n```", re.MULTILINE | re.DOTALL)
SECONDS = 60


def stops():
    """(title, command) of each stop, its one fenced command."""
    found = []
    for title, body in STOP.findall((ROOT / "docs" / "learn.md").read_text()):
        commands = COMMAND.findall(body)
        assert len(commands) == 1, f"{title}: a stop has one command"
        found.append((title, commands[0]))
    return found


def test_the_path_has_about_eight_stops():
    assert 7 <= len(stops()) <= 10


@pytest.mark.slow
@pytest.mark.parametrize("title, command", stops(), ids=[title.split(".")[0] for title, _ in stops()])
def test_the_stop_runs_within_a_minute(title, command):
    bin_dir = str(Path(sys.executable).parent)  # python, mpiexec and the console scripts of this environment
    start = time.monotonic()
    done = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=SECONDS,
                          env={**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"]})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert time.monotonic() - start < SECONDS
