"""ftrun-chaos on hosts reached by ssh: a real sshd in each of 5 network
namespaces (4 nodes + a spare), the runner's `--launcher ssh` starting the
agents there, and the faults sent over ssh (signals to ranks and agents, a
whole node killed, a bit flipped in an agent's shared memory through a
python3 one-liner on the host), plus a coordinator kill and disk faults in
the shared persist directory. ftrun-chaos must exit 0 with every check
passed; a plan asking the ssh backend for a network fault is refused."""
import json
import os
import shutil
import subprocess
import time

import pytest

from ftrun_chaos import netns_cluster as nc
from ftrun_testlib import BUILD, scratch

PORT = 2222
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def ssh_ready(c, opts, i):
    p = subprocess.run(["ssh", "-o", "BatchMode=yes"] + opts.split() + [c.addr(i), "true"], capture_output=True)
    return p.returncode == 0


@pytest.fixture(scope="module")
def hosts():
    """5 namespaces, each with an sshd that takes this machine's key; yields (directory, plan)."""
    ok, why = nc.available()
    if not ok or not os.access(SSHD, os.X_OK) or not shutil.which("ssh"):
        pytest.skip(why or "no sshd/ssh (openssh-server, openssh-client)")
    d = scratch("ftrun-chaos-ssh-")
    for key in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(d, key)], check=True)
    shutil.copy(os.path.join(d, "userkey.pub"), os.path.join(d, "authorized_keys"))
    with open(os.path.join(d, "sshd_config"), "w") as f:
        f.write("Port %d\nHostKey %s/hostkey\nPermitRootLogin prohibit-password\n"
                "AuthorizedKeysFile %s/authorized_keys\n"
                "StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nPidFile none\n"
                "MaxStartups 100\nMaxSessions 100\n" % (PORT, d, d))
    os.makedirs("/run/sshd", exist_ok=True)  # its privilege separation directory
    opts = ("-p %d -i %s/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
            % (PORT, d))
    run_dir, persist = os.path.join(d, "run"), os.path.join(d, "persist")
    os.makedirs(run_dir)
    os.makedirs(persist)
    # The persist directory on its own small filesystem: disk_full fills it, and
    # must never fill the machine's.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "ftrun-chaos-ssh", persist], check=True)
    try:
        with nc.NetnsCluster(5) as c:
            # UCX on one named device everywhere (the bridge here, the same name for each namespace's end):
            # with all devices, a bridge of another test coming or going stalls the coordinator's UCX.
            for i in range(5):
                veth = c.device(i)
                for argv in (["dev", veth, "down"], ["dev", veth, "name", c.bridge], ["dev", c.bridge, "up"]):
                    subprocess.run([nc.IP, "-n", c.netns(i), "link", "set"] + argv, check=True)
            c.check_connectivity()
            sshds = [subprocess.Popen(c.exec_prefix(i) + [SSHD, "-D", "-f", os.path.join(d, "sshd_config"),
                                                          "-o", "ListenAddress=" + c.addr(i)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(5)]
            try:
                deadline = time.time() + 20
                while not all(ssh_ready(c, opts, i) for i in range(5)) and time.time() < deadline:
                    time.sleep(0.2)
                assert all(ssh_ready(c, opts, i) for i in range(5)), "sshd answers in every namespace"
                plan = os.path.join(d, "ssh.yaml")
                # The hang comes last: until hang_timeout (10 s) finds it, the other ranks run on, hundreds of
                # steps ahead of the committed version, and a fault planned after it could find the job ended.
                with open(plan, "w") as f:
                    f.write("name: over ssh\n"
                            "cluster:\n  backend: ssh\n  hosts: [%s]\n  spares: 1\n  ranks_per_node: 2\n"
                            "  replicas: 1\n"
                            "  ssh: ssh -o BatchMode=yes %s\n  launcher_args: %s\n  coordinator_addr: %s\n"
                            "  env: {UCX_TLS: 'tcp,self', UCX_NET_DEVICES: %s}\n  run_dir: %s\n"
                            "job:\n  synthetic: {state_bytes: 2MiB, tensors: 4, steps: 900, step_ms: 20}\n"
                            "  config: \"job: {hang_timeout: 10s}\\n\"\n"
                            "persist: {dir: %s, every_versions: 10}\n"
                            "faults:\n"
                            "  - {kind: rank_kill, at_step: 60, signal: SIGKILL}\n"
                            "  - {kind: rank_kill, at_step: 150, signal: SIGTERM, target: {rank: 5}}\n"
                            "  - {kind: bitflip_shm, at_step: 240, target: {node: 2}}\n"
                            "  - {kind: disk_full, at_step: 300, duration: 1s}\n"
                            "  - {kind: node_kill, at_step: 350, target: {node: 1}}\n"
                            "  - {kind: coordinator_kill, at_step: 450, attach_after: 1s}\n"
                            "  - {kind: bitflip_disk, at_step: 550}\n"
                            "  - {kind: rank_hang, at_step: 650}\n"
                            % (", ".join(c.addr(i) for i in range(5)), opts, json.dumps(opts), c.root_addr,
                               c.bridge, run_dir, persist))
                yield d, plan
            finally:
                for s in sshds:
                    s.terminate()
                    s.wait(timeout=10)
    finally:
        subprocess.run(["umount", "-l", persist])


def test_faults_over_ssh(check, hosts):
    """8 faults sent over ssh (and the coordinator's and the disk's): every check of ftrun-chaos passes, and
    the bit flipped over ssh is found."""
    d, plan = hosts
    out = os.path.join(d, "out")
    p = subprocess.run([os.path.join(BUILD, "ftrun-chaos"), "--plan", plan, "--out", out, "--build", BUILD],
                       capture_output=True, text=True, timeout=600)
    print(p.stdout[-3000:], p.stderr[-3000:], flush=True)
    check(p.returncode == 0, "ssh: ftrun-chaos exit %d (want 0); report in %s" % (p.returncode, out))
    try:
        with open(os.path.join(out, "report.json")) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        rep = None
    if check(rep is not None, "ssh: report.json written"):
        check(rep["summary"]["faults_injected"] == 8, "ssh: 8 faults injected: %s" % rep["summary"])
        check(all(x["ok"] for x in rep["checks"]),
              "ssh: failed checks %s" % [x for x in rep["checks"] if not x["ok"]])
        shm = [f for f in rep["faults"] if f["kind"] == "bitflip_shm"]
        check(shm and shm[0]["detected"], "ssh: the bit flipped over ssh was found: %s" % shm)


def test_network_fault_refused(check, hosts):
    """A plan that asks the ssh backend for a network fault is refused with exit 2, naming both."""
    d, plan = hosts
    with open(os.path.join(d, "bad.yaml"), "w") as f:
        f.write(open(plan).read().replace("kind: disk_full", "kind: partition"))
    p = subprocess.run([os.path.join(BUILD, "ftrun-chaos"), "--plan", os.path.join(d, "bad.yaml")],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "cluster.backend" in p.stderr and "partition" in p.stderr,
          "ssh: a network fault is refused: %r" % p.stderr)
