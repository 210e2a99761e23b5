"""A training job under mpiexec in the background, watched from a test: its output line by line, its
steps.jsonl and ranks.json as they are written, its end within a deadline."""
import json
import os
import queue
import signal
import subprocess
import threading
import time

import pytest


class Job:
    """A training run in the background (`process`, started by mpi.launch or mpi.hosts, writing into
    `output_dir`), its stderr read line by line as it comes."""

    def __init__(self, process, output_dir):
        self.output_dir = output_dir
        self.process = process
        self.lines, self.err, self.out = queue.Queue(), [], []
        self.readers = [threading.Thread(target=self._read, args=(self.process.stderr, self.err, self.lines),
                                         daemon=True),
                        threading.Thread(target=self._read, args=(self.process.stdout, self.out, None), daemon=True)]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, kept, lines):
        for line in stream:
            kept.append(line)
            if lines is not None:
                lines.put(line)

    def wait_until(self, condition, seconds, what):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            value = condition()
            if value:
                return value
            assert self.process.poll() is None, f"the job ended before {what}\n{self.output()}"
            time.sleep(0.005)
        self.kill()
        pytest.fail(f"no {what} within {seconds} s\n{self.output()}")

    def ranks(self):
        path = self.output_dir / "ranks.json"
        return self.wait_until(lambda: path.exists() and json.loads(path.read_text()), 60, "ranks.json")

    def steps(self):
        path = self.output_dir / "steps.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def line_naming(self, rank, pid, seconds):
        """The next stderr line that names `rank` by its pid, or None within `seconds`."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if f"rank {rank} (pid {pid} " in line:
                return line
        return None

    def end(self, seconds):
        """The launcher's exit status within `seconds` (else the job is killed and the test fails),
        its output read to the end."""
        try:
            status = self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the job still ran {seconds} s later\n{self.output()}")
        for reader in self.readers:
            reader.join(timeout=5)
        return status

    def kill(self):
        """SIGKILL the launcher's session: mpiexec, its proxies and the ranks (stopped or not)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def output(self):
        time.sleep(0.2)  # the readers' last lines
        return "".join(self.out)[-3000:] + "\n" + "".join(self.err)[-3000:]
