"""A control plane that fails over by itself (coordinator.etcd_endpoints):
a real three-member etcd cluster on loopback, started here; the job's
runner leads it through an etcd lease, a standby coordinator (`ftrun
--standby-coordinator JOB`) waits, and the agents find the leader in etcd.

- The leading runner SIGKILLed mid-run: the standby takes the job over with
  no human action, the job ends with the failure-free run's digests, and
  the standby ends with the job's exit code.
- The etcd cluster's leader member SIGKILLed mid-run: the job goes on under
  the same coordinator and ends right.
- The same with the real PyTorch trainer (train_gpt.py, gloo): it ends
  bit-identical to its failure-free run, every step's loss and the weights.
- The leading runner cut off from etcd (a proxy drops its connections): it
  steps down before its lease can lapse, the standby takes over only after
  that, the job ends right, and once the partition heals the deposed runner
  ends with the job's exit code.
"""
import hashlib
import hmac
import json
import os
import re
import socket
import subprocess
import time

import pytest

from etcd_cluster import ETCD, EtcdCluster, PartitionProxy
from ftrun_testlib import BUILD, RUNNER, ClusterJob, ScriptClusterJob, digests, golden, scratch
from test_train_gpt import SCRIPT, losses, seeds, weights  # noqa: F401 (seeds: a fixture)

ARGS = ["--steps", "250", "--state-bytes", "4MiB", "--tensors", "2", "--step-ms", "20"]
TTL_S = 4
CONFIG = ("store:\n  memory_budget: 96MiB\ncluster:\n  replicas: 1\n  lost_node_timeout: 60s\n"
          "coordinator:\n  etcd_endpoints: %s\n  etcd_prefix: /ftrun-test\n  etcd_lease_ttl: " + str(TTL_S) + "s\n")
# A lease must outlast an etcd leader election (about a second, more on a loaded machine) to ride one out.
CONFIG_LONG_LEASE = CONFIG.replace(f"etcd_lease_ttl: {TTL_S}s", "etcd_lease_ttl: 10s")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) ")

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd-server is not installed "
                                "(scripts/install-deps.sh installs it)")


@pytest.fixture(scope="module")
def etcd():
    root = scratch("ftrun-etcd-")
    cluster = EtcdCluster(root)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def want():
    return golden(4, ARGS)


def stamp(line):
    m = STAMP.match(line)
    return time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + float(m.group(1)[19:]) if m else None


def first(log, text):
    """The time of the first log line containing text (None: none)."""
    for line in log.splitlines():
        if text in line:
            return stamp(line)
    return None


def leader_of(etcd, job):
    got = etcd.get(f"/ftrun-test/{job}/leader")
    return (json.loads(got[0]), got[1]) if got else (None, 0)


def start_standby(job, config, log_path):
    """`ftrun --standby-coordinator`, once it waits on the job's leader (up to 20 s): (process, its output)."""
    out = open(log_path, "w+")
    proc = subprocess.Popen([RUNNER, "--standby-coordinator", job, "--config", config], stdout=out,
                            stderr=subprocess.STDOUT)
    deadline = time.time() + 20
    while "waiting" not in read(out) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    return proc, out


def exit_code(proc, timeout):
    """The process's exit code, or "timeout" (then it is killed)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "timeout"


def running(job, at_least):
    return job.wait_for(lambda s: s.get("phase") == "running" and (s.get("committed_version") or 0) >= at_least,
                        timeout=120)


def read(out):
    out.flush()
    out.seek(0)
    return out.read()


def started_with_standby(check, etcd, args, at_least, config=CONFIG, nodes=2, spares=0):
    """A job of `nodes` x 2 ranks running until it committed `at_least`, and a standby coordinator waiting on it:
    (job, its status, the standby, the standby's output); None (a failed check) when the job never commits."""
    job = ClusterJob(nodes, 2, args, config=config % ",".join(etcd.endpoints()), spares=spares)
    st = running(job, at_least)
    if not check(st is not None, f"the job runs and commits:\n{read(job.out)[-3000:]}"):
        return None
    standby, sout = start_standby(st["job_id"], job.config, os.path.join(job.dir, "standby.log"))
    return job, st, standby, sout


def test_standby_takes_over_when_the_leader_dies(check, etcd, want):
    """SIGKILL the leading runner: the standby leads within the lease TTL plus a second or so, and the job
    ends with the failure-free digests."""
    started = started_with_standby(check, etcd, ARGS, 20)
    if started is None:
        return
    job, st, standby, sout = started
    job_id = st["job_id"]
    record, term = leader_of(etcd, job_id)
    check(record and record.get("pid") == job.proc.pid and record.get("address") == st["coordinator"],
          f"etcd names the runner the job's coordinator: {record}")
    check("the job's coordinator is pid %d" % job.proc.pid in read(sout), "the standby waits on the runner")
    job.proc.kill()
    killed = time.time()
    job.proc.wait()
    took = None
    while time.time() < killed + 60:
        record2, term2 = leader_of(etcd, job_id)
        if term2 > term and record2 and record2.get("address"):
            took = time.time() - killed
            break
        time.sleep(0.02)
    check(took is not None, f"the standby leads within 60 s:\n{read(sout)[-3000:]}")
    if took is not None:
        print(f"coordinator failover: {took:.2f} s from the SIGKILL to the new leader's address in etcd "
              f"(lease TTL {TTL_S} s)", flush=True)
        check(record2["pid"] == standby.pid and record2["address"] != record["address"],
              f"the new leader is the standby, on its own address: {record2}")
        want_line = f"coordinator: pid {standby.pid} at {record2['address']}, leading through etcd (term {term2},"
        shown = ""
        while time.time() < killed + 30 and want_line not in shown and standby.poll() is None:
            shown = subprocess.run([RUNNER, "status", job_id, "--config", job.config], capture_output=True,
                                   text=True).stdout
            time.sleep(0.1)
        check(want_line in shown, f"`ftrun status` names the new leader while the job runs:\n{shown}")
    rc = exit_code(standby, 240)
    log = read(sout)
    print(log[-2500:], flush=True)
    check(rc == 0, f"the standby ends the job with exit 0 (got {rc})")
    check(", node 0)" in log and ", node 1)" in log, "the standby adopts both agents, each as its node")
    end = etcd.get(f"/ftrun-test/{job_id}/end")
    check(end and json.loads(end[0]).get("exit_code") == 0, f"the job's end is in etcd: {end}")
    time.sleep(0.5)
    ranks_out = read(job.out)
    check("the coordinator moved from" in ranks_out, "the agents followed etcd to the new coordinator")
    moved, restarted = first(ranks_out, "the coordinator moved from"), first(log, "epoch 1: started")
    if moved and restarted:
        print(f"after the SIGKILL: agents at the new coordinator {moved - killed:.2f} s, every rank restarted from "
              f"the committed version {restarted - killed:.2f} s", flush=True)
    check(digests(ranks_out) == want, f"digests after the failover equal the failure-free run's "
          f"({digests(ranks_out)} vs {want})")


def test_partitioned_leader_steps_down_first(check, etcd, want):
    """The leading runner cut off from etcd: it steps down before its lease can lapse, the standby leads only
    after that, the job ends right, and the healed runner ends with the job's exit code."""
    proxy = PartitionProxy(etcd.client[0])
    try:
        job = ClusterJob(2, 2, ARGS, config=CONFIG % proxy.endpoint())
        st = running(job, 20)
        if not check(st is not None, f"the job runs and commits:\n{read(job.out)[-3000:]}"):
            return
        standby, sout = start_standby(st["job_id"], job.config, os.path.join(job.dir, "standby.log"))
        proxy.cut(job.proc.pid)
        cut_at = time.time()
        deadline = time.time() + 60
        while "taking job" not in read(sout) and time.time() < deadline:
            time.sleep(0.05)
        rc = exit_code(standby, 240)
        proxy.heal()
        runner_rc = job.wait(timeout=60)
        log, runner_log = read(sout), job.log
        print(log[-2000:], flush=True)
        down = first(runner_log, "stepping down")
        took = first(log, "coordinator: leading the job")
        check(down is not None, f"the cut-off runner steps down:\n{runner_log[-3000:]}")
        check(took is not None, f"the standby leads:\n{log[-3000:]}")
        if down is not None and took is not None:
            print(f"partition: the runner stepped down {down - cut_at:.2f} s after the cut, the standby led "
                  f"{took - down:.2f} s after that", flush=True)
            check(down < took, "no two coordinators lead at once: the step-down comes before the takeover")
        check(rc == 0, f"the standby ends the job with exit 0 (got {rc})")
        check("adopted agent 0 (pid" in log and ", node 0)" in log and ", node 1)" in log,
              "the state in etcd had the agents' nodes before the cut (published at once when they join)")
        check(runner_rc == 0, f"the deposed runner, healed, ends with the job's exit 0 (got {runner_rc})")
        check(digests(runner_log) == want, f"digests after the partition equal the failure-free run's "
              f"({digests(runner_log)} vs {want})")
    finally:
        proxy.stop()


def test_etcd_leader_member_killed(check, etcd, want):
    """SIGKILL the etcd cluster's leader member mid-run: the same coordinator goes on leading (the client
    moves to another member, the lease outlasts the election) and the job ends right."""
    job = ClusterJob(2, 2, ARGS, config=CONFIG_LONG_LEASE % ",".join(etcd.endpoints()))
    st = running(job, 20)
    if not check(st is not None, f"the job runs and commits:\n{read(job.out)[-3000:]}"):
        return
    victim = etcd.leader()
    check(victim is not None, "the etcd cluster has a leader")
    if victim is not None:
        etcd.kill(victim)
        print(f"killed etcd member {etcd.names[victim]} (the leader)", flush=True)
    after = running(job, (st.get("committed_version") or 0) + 40)
    check(after is not None, "the job goes on committing without the etcd leader member")
    rc = job.wait(timeout=240)
    check(rc == 0, f"the job ends with exit 0 (got {rc}):\n{job.log[-3000:]}")
    check("stepping down" not in job.log, "the coordinator kept its lease through the etcd election")
    check(digests(job.log) == want, f"digests equal the failure-free run's ({digests(job.log)} vs {want})")


def test_train_gpt_survives_a_coordinator_failover(check, etcd, seeds):
    """train_gpt.py (torch, gloo, 2 nodes x 2 ranks): the leading runner SIGKILLed mid-run, the standby takes
    over, and every step's loss and the final weights equal the failure-free run's."""
    if not os.path.isdir(os.path.join(BUILD, "python", "ftrun")):
        pytest.skip(f"{BUILD} has no ftrun Python package (the ASan build): train_gpt.py cannot run")
    _, _, model_seed = seeds
    gpt = ["--steps", "30", "--seed", str(model_seed), "--backend", "gloo", "--step-ms", "150"]
    base = "job:\n  max_restarts: 3\n  stop_grace: 2s\nstore:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n"
    free = ScriptClusterJob(SCRIPT, gpt, 2, 2, base, prefix="ftrun-gpt-", ports=4)
    check(free.wait(timeout=180) == 0, f"failure-free run:\n{free.log[-3000:]}")
    want_loss, want_weights = losses(free.log), weights(free.log)
    config = base + "coordinator:\n  etcd_endpoints: %s\n  etcd_prefix: /ftrun-test\n  etcd_lease_ttl: %ds\n" % (
        ",".join(etcd.endpoints()), TTL_S)
    job = ScriptClusterJob(SCRIPT, gpt, 2, 2, config, prefix="ftrun-gpt-", ports=4)
    st = job.wait_for(lambda s: s.get("phase") == "running" and (s.get("committed_version") or 0) >= 8, timeout=120)
    if not check(st is not None, f"the job runs and commits:\n{read(job.out)[-3000:]}"):
        return
    standby, sout = start_standby(st["job_id"], job.config, os.path.join(job.dir, "standby.log"))
    job.proc.kill()
    job.proc.wait()
    rc = exit_code(standby, 240)
    check(rc == 0, f"the standby ends the job with exit 0 (got {rc}):\n{read(sout)[-3000:]}")
    time.sleep(0.5)
    out = read(job.out)
    check("the coordinator moved from" in out and "RESUMED" in out,
          "the ranks resumed under the standby (the kill came mid-run)")
    got = losses(out)
    check(sorted(want_loss) == list(range(30)) and got == want_loss,
          f"every step's loss equals the failure-free run's: differ at "
          f"{[k for k in range(30) if got.get(k) != want_loss.get(k)]}")
    check(weights(out) == want_weights and len(want_weights) == 4, f"final weights {weights(out)} != {want_weights}")


def job_with_secret(prefix, job_id, etcd):
    """A standby's config whose agent.run_dir holds job_id's secret (0600, as the runner writes it): (dir, config,
    secret)."""
    d = scratch(prefix)
    config = os.path.join(d, "ftrun.yaml")
    with open(config, "w") as f:
        f.write(f"agent:\n  run_dir: {d}/run\n" + CONFIG % ",".join(etcd.endpoints()))
    os.makedirs(os.path.join(d, "run", job_id), mode=0o700)
    os.chmod(os.path.join(d, "run"), 0o700)
    secret = os.urandom(32).hex()
    fd = os.open(os.path.join(d, "run", job_id, "secret"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (secret + "\n").encode())
    os.close(fd)
    return d, config, secret


def signed(secret, job_id, state):
    """The etcd value a leader writes for `state` (launcher/runner/signed_state.h)."""
    mac = hmac.new(secret.encode(), f"etcd-state|{job_id}|{state}".encode(), hashlib.sha256).hexdigest()
    return json.dumps({"state": state, "mac": mac})


@pytest.mark.parametrize("state, want", [
    ("not json", "expected {\"argv\": [...]} written by the job's runner"),
    ('{"argv": ["--num_nodes", "2", "train.py"]}', "expected a 'status' object next to 'argv'"),
    ('{"argv": ["--num_nodes", 2], "status": {}}', "'argv' holds a non-string"),
    ('{"argv": ["--num_nodes", "2", "--config", "CONFIG", "--no_python", "x"], '
     '"status": {"coordinator": 1, "agents": {}}}',
     "has no 'coordinator' (a string) and 'agents' (a list)"),
])
def test_standby_refuses_a_bad_state(check, etcd, state, want):
    """The state a leader left in etcd is read as hostile: a standby that wins a job whose state is malformed
    (signed with the job secret, as a leader's own bug would leave it) exits 2 naming the key and what is wrong,
    and lets its lease go for another."""
    job_id = "job-bad-state-%d" % (abs(hash(state)) % 100000)
    d, config, secret = job_with_secret("ftrun-etcd-bad-", job_id, etcd)
    etcd.put(f"/ftrun-test/{job_id}/state", signed(secret, job_id, state.replace("CONFIG", config)))
    standby, sout = start_standby(job_id, config, os.path.join(d, "standby.log"))
    rc = exit_code(standby, 60)
    log = read(sout)
    check(rc == 2, f"exit 2 (got {rc}):\n{log[-2000:]}")
    check(want in log and (f"/ftrun-test/{job_id}/state" in log), f"the error names the key and the fault:\n{log}")
    print(log.strip().splitlines()[-1], flush=True)


@pytest.mark.parametrize("how", ["unsigned", "another key", "another job's"])
def test_standby_obeys_no_state_the_job_did_not_sign(check, etcd, how):
    """Issue 33, finding 3: anyone who can write the job's etcd prefix (etcd on loopback without auth: any local
    user) rewrites its state: a command line that runs a command, a status file to overwrite, agents whose pids are
    a same-user `sleep` (its real start time, from /proc) on this host; then deletes the leader key. The standby
    wins the lease and refuses the state: exit 2, naming the key and the secret file; no command runs, no file is
    written, nothing is killed."""
    job_id = "job-hostile-" + how.replace(" ", "-").replace("'", "")
    d, config, secret = job_with_secret("ftrun-etcd-hostile-", job_id, etcd)
    victim = subprocess.Popen(["sleep", "600"])
    try:
        with open(f"/proc/{victim.pid}/stat") as f:
            start_time = int(f.read().rsplit(")", 1)[1].split()[19])
        pwned, status_file = os.path.join(d, "pwned"), os.path.join(d, "victim-status.json")
        state = json.dumps({
            "argv": ["--num_nodes", "1", "--config", config, "--status_file", status_file, "--no_python",
                     "touch", pwned],
            "status": {"job_id": job_id, "coordinator": "127.0.0.1:1", "runner_host": socket.gethostname(),
                       "agents": [{"id": 1, "slot": 0, "pid": victim.pid, "start_time": start_time,
                                   "status_file": status_file}],
                       "nodes": [{"node": 0, "agent": 1}]}})
        value = {"unsigned": state,
                 "another key": signed(os.urandom(32).hex(), job_id, state),
                 "another job's": signed(secret, "some-other-job", state)}[how]
        etcd.put(f"/ftrun-test/{job_id}/state", value)
        etcd.delete(f"/ftrun-test/{job_id}/leader")
        standby, sout = start_standby(job_id, config, os.path.join(d, "standby.log"))
        rc = exit_code(standby, 60)
        log = read(sout)
        check(rc == 2, f"exit 2 (got {rc}):\n{log[-2000:]}")
        check(f"/ftrun-test/{job_id}/state" in log and ("nothing of it is used" in log or "not signed" in log),
              f"the error names the key and why:\n{log}")
        time.sleep(1)
        check(not os.path.exists(pwned), "the command line from etcd ran")
        check(not os.path.exists(status_file), "the status file named in etcd was written")
        check(victim.poll() is None, "the process etcd named as an agent was killed")
        print(log.strip().splitlines()[-1], flush=True)
    finally:
        victim.kill()
        victim.wait()


EC_ARGS = ["--steps", "500", "--state-bytes", "4MiB", "--tensors", "2", "--step-ms", "20", "--change-fraction", "0.3"]
EC_CONFIG = ("job:\n  max_restarts: 10\n  stop_grace: 2s\nstore:\n  memory_budget: 256MiB\n  chunk_size: 1MiB\n"
             "  prefault: false\ncluster:\n  redundancy: {erasure: {data: 2, parity: 1}}\n"
             "  heartbeat_interval: 200ms\n  heartbeat_misses: 10\n  lost_node_timeout: 60s\n"
             "coordinator:\n  etcd_endpoints: %s\n  etcd_prefix: /ftrun-test\n  etcd_lease_ttl: " + str(TTL_S) + "s\n")


def test_erasure_protection_survives_a_failover(check, etcd):
    """Issue 33, findings 1 and 4: a 2+1 erasure-coded job (3 nodes x 2 ranks + a spare) whose leading runner is
    SIGKILLed mid-run (commit rounds every few steps: mid-round). The standby starts the agents in a new epoch with
    no halt, counts the parity they register with, and the versions it commits have right parity: a node SIGKILLed
    after its first commits is rebuilt on the spare from the group, and the job ends with the failure-free
    digests."""
    want = golden(6, EC_ARGS)
    started = started_with_standby(check, etcd, EC_ARGS, 10, config=EC_CONFIG, nodes=3, spares=1)
    if started is None:
        return
    job, st, standby, sout = started
    before = st["committed_version"]
    job.proc.kill()
    job.proc.wait()
    # The standby leads, right away knows the group survives one loss (the agents' registered parity), and
    # commits versions of its own.
    job.proc = standby  # the status file is the standby's now (the job's --status_file)
    st = job.wait_for(lambda s: s.get("phase") == "running" and s.get("epoch", 0) >= 1 and
                      (s.get("committed_version") or 0) > before + 5 and
                      [g["survives"] for g in (s.get("erasure") or {}).get("groups", [])] == [1], timeout=120)
    if not check(st is not None, f"the standby leads and commits with the group's parity complete:\n"
                 f"{read(sout)[-3000:]}"):
        standby.kill()
        return
    check(job.kill_node(0), "node 0 killed")
    rc = exit_code(standby, 240)
    log = read(sout)
    print(log[-2500:], flush=True)
    check(rc == 0, f"the standby ends the job with exit 0 (got {rc})")
    ranks_out = read(job.out)
    check("from the erasure group" in ranks_out, "node 0 was rebuilt from its erasure group")
    check(digests(ranks_out) == want, f"digests after the failover and the node loss equal the failure-free run's "
          f"({digests(ranks_out)} vs {want})")


LONG_ARGS = ["--steps", "600", "--state-bytes", "4MiB", "--tensors", "2", "--step-ms", "20"]


def test_a_deleted_leader_key_is_noticed_at_the_next_renewal(check, etcd):
    """Issue 33, finding 8: the leader key deleted under a running job (an etcd writer, or an operator): the
    leading runner notices at its next lease renewal (ttl/3) or state write, whichever comes first (an idle job
    writes nothing), and steps down; the standby leads, and the job ends with the failure-free digests."""
    want = golden(4, LONG_ARGS)
    started = started_with_standby(check, etcd, LONG_ARGS, 10)
    if started is None:
        return
    job, st, standby, sout = started
    job_id = st["job_id"]
    etcd.delete(f"/ftrun-test/{job_id}/leader")
    deleted = time.time()
    # At the next renewal, or sooner at the next write of the state (a busy job writes every second).
    while time.time() < deleted + 30 and "stepping down" not in read(job.out):
        time.sleep(0.05)
    noticed = first(read(job.out), "stepping down")
    check(noticed is not None and noticed - deleted < TTL_S,
          f"the runner steps down within the lease TTL:\n{read(job.out)[-3000:]}")
    if noticed is not None:
        print(f"leader key deleted: the runner stepped down {noticed - deleted:.2f} s later "
              f"(lease TTL {TTL_S} s)", flush=True)
    rc = exit_code(standby, 240)
    check(rc == 0, f"the standby ends the job with exit 0 (got {rc}):\n{read(sout)[-2500:]}")
    job.wait(timeout=60)
    check(digests(read(job.out)) == want, f"digests equal the failure-free run's ({digests(read(job.out))})")
