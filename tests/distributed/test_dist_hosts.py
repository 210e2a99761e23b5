"""Several hosts on one machine (tests/mpi/hosts.py): every host its own name, address, shared memory
and /tmp, mpiexec across them over TCP; the job finds its nodes, and the node-aware parts work on
them (tests/mpi/check_nodes.py, check_allreduce.py); only rank 0 writes; everything made is removed.

The oracles are the hosts as the fixture made them (names, placement of ranks, private folders)
and UCX's own report of the transports it chose (UCX_PROTO_INFO, one log file per process)."""
import collections
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from minidl.data import make_embedded_dataset
from mpi import hosts

pytestmark = pytest.mark.slow  # every test runs mpiexec across namespaces

UCX_ROW = re.compile(r"^\[[\d.]+\] \[[^]]+\]\s+\|(.*)\|\s*$")


def ucx_transports(folder):
    """{"inter-node" | "intra-node" | "self": the transports UCX chose} from UCX_PROTO_INFO's tables
    in the processes' log files: a table's title names the peers it is for, its rows end in the
    transport (tcp/eth0, sysv/memory, ...)."""
    found = collections.defaultdict(set)
    for log in folder.glob("ucx.*.log"):
        peers = None
        for line in log.read_text().splitlines():
            row = UCX_ROW.match(line)
            if row is None:
                continue
            cells = [cell.strip() for cell in row[1].split("|")]
            title = re.match(r"ucp_context_\d+ (\S+) cfg#\d+$", cells[0])
            if title:
                peers = title[1]
            elif peers is not None and "/" in cells[-1]:
                found[peers].add(cells[-1])
    return found


def test_hosts_have_their_own_names_addresses_and_memory_and_mpi_crosses_them_over_tcp(cluster, tmp_path):
    made = cluster(2)
    names = made.inside(hosts.host_name(1), ["sh", "-c", "hostname; ip -4 -o addr show dev eth0"]).stdout
    assert names.startswith(f"{hosts.host_name(1)}\n") and f"{hosts.SUBNET}.11/24" in names, names
    logs = made.shared / "ucx"
    logs.mkdir()
    done = made.run("check_nodes.py", 2, 2, "/tmp/tuner", env={"UCX_PROTO_INFO": "y",
                                                                "UCX_LOG_FILE": f"{logs}/ucx.%h.%p.log"})
    assert done.returncode == 0 and "4 ranks passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    transports = ucx_transports(logs)
    assert transports["inter-node"] == {"tcp/eth0"}, transports
    assert transports["intra-node"] & {"sysv/memory", "posix/memory", "cma/memory"}, transports


@pytest.mark.parametrize("per_host", [2, 4])
def test_the_job_finds_its_nodes_and_every_algorithm_sums_exactly_across_them(cluster, per_host):
    made = cluster(2)
    for script, args in (("check_nodes.py", (per_host, "/tmp/tuner")), ("check_allreduce.py", (per_host,))):
        done = made.run(script, per_host, *args, timeout=120)
        assert done.returncode == 0, f"{script}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert f"{2 * per_host} ranks passed" in done.stdout


def test_only_rank_0_writes(cluster, tmp_path):
    """A run of 2 hosts × 2 ranks into a folder of each host's own /tmp: host 0 holds the run, host 1
    nothing at all."""
    made = cluster(2)
    data = make_embedded_dataset(made.shared / "data", train_per_class=8, val_per_class=4)
    done = made.run("minidl.train", 2, "--data-path", data, "--output-dir", "/tmp/run", "--model", "resnet8_w8",
                    "-b", 8, "--epochs", 1, "--train-crop-size", 16, "--val-crop-size", 16, "--val-resize-size", 16,
                    "--augment", "none", "--allreduce", "hierarchical", timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = made.path(hosts.host_name(0), "/tmp/run")
    ranks = json.loads((run / "ranks.json").read_text())
    assert [entry["host"] for entry in ranks] == [hosts.host_name(i // 2) for i in range(4)]
    assert (run / "metrics.jsonl").exists() and list(run.glob("checkpoint-*.h5"))
    seen_by_all = [made.path(hosts.host_name(1), folder) for folder in made.mounted_back()]
    written = [path for path in made.path(hosts.host_name(1), "/tmp").rglob("*")
               if not path.is_dir() and not any(folder in path.parents for folder in seen_by_all)]
    assert written == [], written


def test_closing_removes_every_process_namespace_and_link(tmp_path):
    """With a rank stopped and the ranks of a killed proxy left behind (as a cut-off host's are),
    close() leaves no process in the namespaces and none holding them (so the kernel frees them
    with their links, bridge and mounts); the machine's own namespace never had a link of theirs."""
    reason = hosts.unavailable()
    if reason:
        pytest.skip(reason)
    own_links = sorted(os.listdir("/sys/class/net"))
    made = hosts.Cluster(tmp_path, 2)
    try:
        made.start("mpi4py", 2, "-c", "import time; time.sleep(600)")
        deadline = time.monotonic() + 60
        while len(ranks := [pid for pid in made.processes() if "time.sleep" in command_line(pid)]) < 4:
            assert time.monotonic() < deadline, "the four ranks did not start"
            time.sleep(0.05)
        proxy = next(pid for pid, host in made.processes().items()
                     if host == hosts.host_name(1) and "hydra_pmi_proxy" in command_line(pid))
        os.kill(ranks[0], signal.SIGSTOP)
        os.kill(proxy, signal.SIGKILL)
        namespaces = made.namespaces()
        assert len(namespaces) == 3 and sorted(os.listdir("/sys/class/net")) == own_links
    finally:
        made.close()
    assert not set(hosts.network_namespaces().values()) & set(namespaces)


def command_line(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
