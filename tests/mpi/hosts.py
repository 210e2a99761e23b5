"""Several hosts on one machine, and mpiexec across them (as root).

A host is a set of Linux namespaces held open by one sleeping process: its own network stack
(an address on a private subnet, behind a veth pair), its own host name (UTS), its own System V
shared memory (IPC) and its own /dev/shm and /tmp (mount; the test's shared folder, the
repository and Python's environment are mounted back at their paths where they lie under /tmp,
as a cluster's shared file system). A "login" namespace holds the bridge
that joins the hosts' links and runs mpiexec; hydra's ssh launcher is pointed at a script that
runs its proxy inside the named host's namespaces (nsenter). Nothing is made in the machine's
own namespaces, so nothing collides with other work: every interface and address lives and
dies with the namespaces. Shared memory cannot cross hosts (each has its own), so MPI's
transport between hosts is TCP over the bridge, and a host is cut off by taking its link down.

docs/distributed.md, "Several hosts on one machine", does the same by hand.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpi import launch

SUBNET = "10.236.36"  # a private /24 only these namespaces use; the login node is .1, host i is .(10 + i)
LOGIN, BRIDGE = "mdl-i36-login", "mdl-i36-br"
TOOLS = ("ip", "unshare", "nsenter", "setpriv")


def host_name(index):
    return f"mdl-i36-h{index}"


def unavailable():
    """Why namespaces cannot be made here (one line), or None."""
    if os.geteuid() != 0:
        return "several hosts on one machine need root (network namespaces): CI runs as root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"several hosts on one machine need {', '.join(missing)} (iproute2, util-linux)"
    trial = subprocess.run(["unshare", "--net", "--uts", "--ipc", "--mount", "true"], capture_output=True, text=True)
    if trial.returncode != 0:
        return f"namespaces cannot be made here (a container without CAP_SYS_ADMIN?): {trial.stderr.strip()}"
    return None


# Run by each holder inside its new namespaces (sh -c SCRIPT NAME HOSTS_FILE MODE FOLDER...):
# the host name, /etc/hosts, and for a host (MODE private) a private /dev/shm and /tmp with the
# FOLDERs mounted back at their paths (through open descriptors, taken before /tmp is covered)
HOLDER = r"""set -e
hostname "$1"
mount --bind "$2" /etc/hosts
if [ "$3" = private ]; then
    shift 3
    mount -t tmpfs -o mode=1777 tmpfs /dev/shm
    fd=3; for folder in "$@"; do eval "exec $fd<\"\$folder\""; fd=$((fd + 1)); done
    mount -t tmpfs -o mode=1777 tmpfs /tmp
    fd=3
    for folder in "$@"; do
        mkdir -p "$folder"
        mount --no-canonicalize --bind /proc/self/fd/$fd "$folder"
        eval "exec $fd<&-"; fd=$((fd + 1))
    done
fi
ip link set lo up
echo ready
exec sleep infinity
"""
# What every host sees at its own path, as a cluster's shared file system would show it: the
# repository and this Python's environment (under /tmp in a checkout made there)
REPOSITORY = Path(__file__).resolve().parents[2]


# hydra's ssh launcher runs LAUNCHER [-x] HOST COMMAND...: the proxy, in HOST's namespaces, in
# mpiexec's folder; it is exec'd, so the launcher's kill of "ssh" reaches the proxy itself
LAUNCHER = """#!/bin/sh
[ "$1" = -x ] && shift
host=$1; shift
case $host in
{cases}
  *) echo "no host $host on this machine" >&2; exit 255 ;;
esac
exec nsenter -t "$pid" -n -u -i -m --wd="$PWD" sh -c "$*"
"""


class Cluster:
    """`hosts` hosts with an address and a name each, joined by a bridge in a login namespace;
    `shared` (a folder) is seen at its path on every host. `close()` removes everything."""

    def __init__(self, shared, hosts=2):
        self.shared = Path(shared)
        self.names = [host_name(i) for i in range(hosts)]
        self.holders = {}  # name -> Popen of the process that holds its namespaces
        self.jobs = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        hosts_file = self.shared / "etc-hosts"
        hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
            f"{address} {name}\n" for name, address in [(LOGIN, self.address(LOGIN)), *self.addresses()]))
        for name in [LOGIN, *self.names]:
            self.holders[name] = self._hold(name, hosts_file)
        self.login(["ip", "link", "add", BRIDGE, "type", "bridge"])
        self.login(["ip", "addr", "add", f"{self.address(LOGIN)}/24", "dev", BRIDGE])
        self.login(["ip", "link", "set", BRIDGE, "up"])
        for name, address in self.addresses():
            self.login(["ip", "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns",
                        str(self.pid(name))])
            self.login(["ip", "link", "set", name, "master", BRIDGE, "up"])
            self.inside(name, ["ip", "addr", "add", f"{address}/24", "dev", "eth0"])
            self.inside(name, ["ip", "link", "set", "eth0", "up"])
        cases = "".join(f"  {name}) pid={self.pid(name)} ;;\n" for name in self.names)
        self.launcher = self.shared / "launcher"
        self.launcher.write_text(LAUNCHER.format(cases=cases))
        self.launcher.chmod(0o755)

    def _hold(self, name, hosts_file):
        # setpriv: the holder dies with this process, even if it is killed before close()
        holder = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "unshare", "--net", "--uts", "--ipc", "--mount",
             "--propagation", "private", "sh", "-c", HOLDER, "holder", name, str(hosts_file),
             "shared" if name == LOGIN else "private", *map(str, self.mounted_back())],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        if holder.stdout.readline().strip() != "ready":
            holder.kill()
            holder.wait()
            raise RuntimeError(f"host {name} could not be made: {holder.stderr.read().strip()}")
        return holder

    def mounted_back(self):
        """The folders under /tmp a host must see at their paths: the shared one, the repository's, Python's."""
        folders = [self.shared, REPOSITORY, Path(sys.prefix).resolve()]
        return [folder for folder in folders if Path("/tmp") in folder.resolve().parents]

    def address(self, name):
        return f"{SUBNET}.1" if name == LOGIN else f"{SUBNET}.{10 + self.names.index(name)}"

    def addresses(self):
        return [(name, self.address(name)) for name in self.names]

    def pid(self, name):
        return self.holders[name].pid

    def inside(self, name, command, **kwargs):
        """Run `command` in host `name`'s namespaces; the CompletedProcess (text), checked."""
        return subprocess.run(["nsenter", "-t", str(self.pid(name)), "-n", "-u", "-i", "-m", *command],
                              check=True, capture_output=True, text=True, **kwargs)

    def login(self, command):
        return self.inside(LOGIN, command)

    def path(self, name, path):
        """`path` as host `name` sees it (its private /tmp and /dev/shm included)."""
        return Path(f"/proc/{self.pid(name)}/root") / Path(path).relative_to("/")

    def cut(self, name):
        """Take host `name`'s link down at the bridge: it can reach no one, and no one it."""
        self.login(["ip", "link", "set", name, "down"])

    def start(self, script, ranks_per_host, *args, env=None, on=None):
        """`launch.start`'s job on hosts `on` (default: all), `ranks_per_host` ranks each (ranks fill
        the hosts in order), mpiexec running on the login node; killed with the cluster."""
        launch.require_mpi()
        on = on or self.names
        hosts = ",".join(f"{name}:{ranks_per_host}" for name in on)
        command = ["setpriv", "--pdeathsig", "KILL", "nsenter", "-t", str(self.pid(LOGIN)), "-n", "-u", "-m",
                   f"--wd={os.getcwd()}", launch.mpiexec(), "-launcher", "ssh", "-launcher-exec",
                   str(self.launcher), "-hosts", hosts, *launch.command(script, ranks_per_host * len(on), *args)[1:]]
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=launch.environment(env), start_new_session=True)
        self.jobs.append(job)
        return job

    def run(self, script, ranks_per_host, *args, env=None, on=None, timeout=120):
        """`start`, waited for; the CompletedProcess (stdout, stderr as text), or a failure after `timeout` s."""
        return launch.finish(self.start(script, ranks_per_host, *args, env=env, on=on), script, timeout)

    def namespaces(self):
        """{network namespace (as /proc/PID/ns/net reads): its name} of the login node and the hosts."""
        return {os.readlink(f"/proc/{holder.pid}/ns/net"): name for name, holder in self.holders.items()
                if holder.poll() is None}

    def processes(self):
        """{pid: host name} of every process inside these namespaces but the holders: mpiexec, proxies,
        ranks, and ranks left behind by a proxy that was killed."""
        ours, holders = self.namespaces(), {holder.pid for holder in self.holders.values()}
        return {pid: ours[space] for pid, space in network_namespaces().items()
                if space in ours and pid not in holders}

    def close(self):
        """Kill every process inside, then the holders: the namespaces, their links, the bridge and
        the mounts go with the last process in them."""
        for job in self.jobs:
            _kill_group(job.pid)
        for _ in range(100):
            left = self.processes()
            if not left:
                break
            for pid in left:
                _kill(pid)
            time.sleep(0.02)
        for holder in self.holders.values():
            _kill_group(holder.pid)
            holder.wait()
            holder.stdout.close()
            holder.stderr.close()
        for job in self.jobs:
            job.wait()


def network_namespaces():
    """{pid: its network namespace} of every process of the machine."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = os.readlink(entry / "ns" / "net")
            except OSError:  # gone meanwhile
                pass
    return found


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass



def main(argv):
    """PYTHONPATH=tests python -m mpi.hosts HOSTS PER_HOST SCRIPT [ARGS...]: SCRIPT (a file of tests/mpi,
    any path ending in .py, or a module) under mpiexec on HOSTS hosts made for it, PER_HOST ranks
    each, in this folder; its output and exit status, the hosts removed after. /tmp and /dev/shm
    are each host's own: files the script writes there go with the hosts."""
    if len(argv) < 3 or not argv[0].isdigit() or not argv[1].isdigit():
        sys.exit("usage: PYTHONPATH=tests python -m mpi.hosts HOSTS PER_HOST SCRIPT [ARGS...]")
    if unavailable():
        sys.exit(unavailable())
    with tempfile.TemporaryDirectory(prefix="minidl-hosts-") as shared:
        cluster = Cluster(shared, int(argv[0]))
        try:
            job = cluster.start(argv[2], int(argv[1]), *argv[3:])
            out, err = job.communicate()
        finally:
            cluster.close()
    sys.stdout.write(out)
    sys.stderr.write(err)
    return job.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
