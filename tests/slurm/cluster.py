"""A one-node Slurm cluster on this machine for the tests: munged, slurmctld and slurmd (Debian's
slurm-wlm and munge, run as root), each with its configuration, key, state, spool, log and
ports in one folder of its own, so that nothing of the machine's is used or changed; `close()`
cancels the jobs, stops the daemons and removes the folder. docs/distributed.md, "Slurm on one
machine", shows the same by hand.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo", "squeue")
# Slurm's grace between a job's SIGTERM and its SIGKILL: small, but what a site may set
KILL_WAIT = 15
# A requeued job may start again after cred_expire + 1 seconds (Slurm's default: 120)
CRED_EXPIRE = 10


def unavailable():
    """Why the cluster cannot be made here (one line), or None."""
    if os.geteuid() != 0:
        return "the Slurm tests start slurmctld, slurmd and munged as root: run them as root (CI does)"
    missing = [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if missing:
        return f"{', '.join(missing)} not found: apt-get install --no-install-recommends slurm-wlm munge"
    return None


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def configuration(root, munge_socket, mpi_plugins, first_job_id):
    """slurm.conf of one node, this machine with its CPUs, processes tracked without cgroups."""
    host = socket.gethostname().split(".")[0]
    lines = [f"ClusterName=minidltest", f"FirstJobId={first_job_id}", f"SlurmctldHost={host}(127.0.0.1)",
             f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}", "SlurmUser=root", "SlurmdUser=root",
             "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket},cred_expire={CRED_EXPIRE}",
             f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
             f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
             f"SlurmctldLogFile={root}/log/slurmctld.log", f"SlurmdLogFile={root}/log/slurmd.log",
             f"PlugStackConfig={root}/plugstack.conf",
             "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
             "AccountingStorageType=accounting_storage/none", "SelectType=select/cons_tres",
             "SelectTypeParameters=CR_CPU", f"KillWait={KILL_WAIT}", "ReturnToService=2",
             "MinJobAge=3600",  # a finished job's record stays for the test that waits on it
             *(["MpiDefault=pmi2"] if "pmi2" in mpi_plugins else []),
             f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN",
             f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP"]
    return "\n".join(lines) + "\n"


class SlurmCluster:
    def __init__(self, root):
        self.root = Path(root)
        self.env = {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}
        self.munge_socket = self.root / "munge" / "munge.socket"
        # MPICH names a job's shared-memory segment after its PMI job id ("1.0"), and a task that
        # was killed leaves it in /dev/shm, where the next job of that id would read its stale
        # addresses in MPI_Init: each cluster numbers its jobs from a fresh start.
        self.first_job_id = random.randrange(10**6, 6 * 10**7)  # below Slurm's MaxJobId
        self.segments_before = set(shared_memory_segments())

    def start(self):
        """Key, munged, configuration, slurmctld and slurmd; returns once sinfo shows the node idle."""
        for folder in ("munge", "state", "spool", "log"):
            (self.root / folder).mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged wants its socket's folders searchable
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge = self.root / "munge"
        self.run("munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                 f"--log-file={munge}/munged.log", f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/munged.seed")
        (self.root / "plugstack.conf").write_text("")
        (self.root / "slurm.conf").write_text(configuration(self.root, self.munge_socket, "", self.first_job_id))
        listed = self.run("srun", "--mpi=list")
        plugins = listed.stdout + listed.stderr
        (self.root / "slurm.conf").write_text(configuration(self.root, self.munge_socket, plugins, self.first_job_id))
        self.run("slurmctld", "-i")
        self.run("slurmd")
        self.wait_for(lambda: self.run("sinfo", "-h", "-o", "%t", check=False).stdout.strip() == "idle", 60,
                      "the node idle in sinfo")

    def run(self, *argv, check=True, timeout=60, env=None):
        """Run a command (a daemon, or a Slurm client of this cluster); its CompletedProcess."""
        result = subprocess.run(argv, capture_output=True, text=True, env=env or self.env, timeout=timeout)
        if check and result.returncode:
            raise RuntimeError(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr.strip()}\n{self.logs()}")
        return result

    def wait_for(self, condition, seconds, what):
        end = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > end:
                raise RuntimeError(f"no {what} within {seconds} s\n{self.logs()}")
            time.sleep(0.2)

    def sbatch(self, *argv):
        """Submit a batch job; its id."""
        return self.run("sbatch", "--parsable", *argv).stdout.strip().split(";")[0]

    def job(self, job):
        """{field: value} of `scontrol show job` (JobState, Restarts, ...)."""
        text = self.run("scontrol", "show", "job", "--oneliner", job).stdout
        return dict(field.split("=", 1) for field in text.split() if "=" in field)

    def logs(self):
        return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(self.root.glob("log/*.log")))

    def close(self):
        """Cancel every job, wait for them to end (at most KillWait and a margin), stop the daemons, remove it all."""
        if (self.root / "slurmctld.pid").exists():
            self.run("scancel", "--full", "--user", "root", check=False)
            try:
                self.wait_for(lambda: not self.run("squeue", "-h", check=False).stdout.strip(), KILL_WAIT + 15,
                              "empty queue")
            except RuntimeError:
                pass  # the daemons go anyway
        for pid_file in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
            path = self.root / pid_file
            if path.exists():
                stop(int(path.read_text()))
        for segment in set(shared_memory_segments()) - self.segments_before - mapped_files():
            segment.unlink(missing_ok=True)  # left by this cluster's killed tasks
        shutil.rmtree(self.root, ignore_errors=True)


def shared_memory_segments():
    return Path("/dev/shm").glob("mpich_shm_*")


def mapped_files():
    """The paths some process of this machine has mapped."""
    paths = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            paths.update(Path(line.split(None, 5)[5].strip()) for line in maps.read_text().splitlines()
                         if line.count(" ") >= 5 and "/dev/shm/" in line)
        except (OSError, IndexError):
            pass
    return paths


def alive(pid):
    """Whether process `pid` runs (a zombie that nobody reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def stop(pid, seconds=10):
    """SIGTERM a daemon, SIGKILL it after `seconds`; return once it is gone."""
    end = time.monotonic() + seconds
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.1)
        if not alive(pid):
            return
