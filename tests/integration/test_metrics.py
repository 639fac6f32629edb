"""Prometheus metrics of a running job: the runner's /metrics (the job as its
coordinator sees it) and each agent's (metrics.agent_listen), scraped over
HTTP from a real 2-node job of the synthetic trainer. Every scrape must pass
`promtool check metrics` (Prometheus' own linter), the values must move as
the job saves and copies, and a SIGKILLed rank must show as a recovery on
the job and on its node, with its phases; the Grafana dashboard may name
only metrics that are served. A port that is taken leaves the
job running, without metrics and with a warning that names the address."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from ftrun_testlib import RUNNER, ClusterJob

ARGS = ["--state-bytes", "8MiB", "--tensors", "4", "--steps", "400", "--step-ms", "20", "--change-fraction", "0.3"]
# Heartbeats tolerate 10 s of silence: under a loaded CI machine (-j2 beside DeepSpeed's tests) every process
# here once stalled past the default 2 s, the coordinator took both nodes for lost and the job stopped mid-scrape
# (the scrape then met a reset, then a refused connection). Node loss by heartbeat is not what this test is about.
CONFIG = ("job:\n  max_restarts: 3\n  stop_grace: 2s\nstore:\n  memory_budget: 256MiB\n  chunk_size: 1MiB\n"
          "  prefault: false\ncluster:\n  heartbeat_interval: 500ms\n  heartbeat_misses: 20\n"
          "metrics:\n  agent_listen: 127.0.0.1:0\n")
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')


def scrape(address):
    """(text, {(name, labels): value}) of one /metrics. A connection reset is
    tried again, twice at most, as Prometheus tries a failed scrape again at
    its next interval."""
    for attempt in range(3):
        try:
            text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
            break
        except ConnectionResetError as e:
            if attempt == 2:
                raise AssertionError(f"scrape of http://{address}/metrics reset 3 times in a row") from e
            print(f"scrape of {address}: {e}; trying again", flush=True)
            time.sleep(0.2)
    values = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            values[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return text, values


def value(values, name, **labels):
    """The sum of a metric's samples whose labels include `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for (n, l), v in values.items() if n == name and all(w in l for w in want))


def promtool_ok(text):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found (scripts/install-deps.sh installs Debian's prometheus package)"
    p = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    return p.returncode == 0, (p.stdout + p.stderr).decode()


def test_metrics_move_and_show_a_recovery(check):
    job = ClusterJob(2, 2, ARGS, config=CONFIG)
    try:
        st = job.wait_for(lambda s: s.get("phase") == "running" and (s.get("committed_version") or 0) >= 3, 60)
        assert st, f"the job never committed:\n{job.log}"
        coord = st["metrics_address"]
        agents = [job.agent_state(a)["metrics_address"] for a in range(2)]
        check(coord and all(agents), f"metrics addresses: coordinator {coord!r}, agents {agents}")
        before = {a: scrape(a)[1] for a in [coord, *agents]}
        for a in [coord, *agents]:
            ok, out = promtool_ok(scrape(a)[0])
            check(ok, f"promtool check metrics on {a}:\n{out}")
        time.sleep(2)
        after = {a: scrape(a)[1] for a in [coord, *agents]}
        for name in ["ftrun_job_committed_version", "ftrun_job_commits_total", "ftrun_job_held_reports_total",
                     "ftrun_job_last_commit_timestamp_seconds"]:
            check(value(after[coord], name) > value(before[coord], name), f"{name} did not move")
        check(value(after[coord], "ftrun_job_running") == 1, "ftrun_job_running is not 1 while the job runs")
        out = subprocess.run([RUNNER, "status", "--config", job.config], capture_output=True, text=True, timeout=30)
        check(f"metrics: http://{coord}/metrics" in out.stdout, f"ftrun status does not name the endpoint:\n{out.stdout}")
        check(value(after[coord], "ftrun_job_ranks_below_redundancy") == 0, "ranks below their redundancy")
        for a in agents:
            for name in ["ftrun_committed_version", "ftrun_sent_bytes_total", "ftrun_received_bytes_total"]:
                check(value(after[a], name) > value(before[a], name), f"{a}: {name} did not move")
            check(value(after[a], "ftrun_ranks_running") == 2, f"{a}: ftrun_ranks_running != 2")
            check(0 < value(after[a], "ftrun_store_used_bytes") <= value(after[a], "ftrun_store_capacity_bytes"),
                  f"{a}: store used bytes out of range")
            # Every save of its 2 ranks is a stall observed; a save takes some time.
            saves = value(after[a], "ftrun_save_stall_seconds_count")
            check(saves > value(before[a], "ftrun_save_stall_seconds_count"), f"{a}: no save stall observed")
            check(value(after[a], "ftrun_save_stall_seconds_sum") > 0, f"{a}: save stalls that took no time")
            check(value(after[a], "ftrun_save_stall_seconds_bucket", le="+Inf") == saves,
                  f"{a}: the +Inf bucket is not the count")
        # A rank SIGKILLed: the job and its node count a recovery, with its phases.
        node_agent = st["nodes"][1]["agent"]
        victim = job.agent_state(node_agent)["ranks"][0]["pid"]
        os.kill(victim, signal.SIGKILL)
        st = job.wait_for(lambda s: (s.get("restarts") or 0) >= 1 and s.get("phase") == "running", 60)
        check(st is not None, "the job did not recover")
        deadline = time.time() + 30
        while time.time() < deadline:
            job_v, node_v = scrape(coord)[1], scrape(agents[node_agent])[1]
            if value(node_v, "ftrun_recoveries_total") >= 1 and value(job_v, "ftrun_job_restarts_total") >= 1:
                break
            time.sleep(0.2)
        check(value(job_v, "ftrun_job_restarts_total") == 1, "ftrun_job_restarts_total != 1 after one kill")
        check(value(job_v, "ftrun_job_recovery_start_seconds_count") == 1, "the recovery's start not observed")
        check(value(node_v, "ftrun_recoveries_total", kind="cold") == 1, "the node's cold recovery not counted")
        for phase in ["stop", "respawn", "restore", "first_step", "total"]:
            check(value(node_v, "ftrun_recovery_phase_seconds_count", phase=phase) == 1, f"phase {phase} not observed")
        check(value(node_v, "ftrun_recovery_phase_seconds_sum", phase="total") > 0, "a recovery that took no time")
        ok, out = promtool_ok(scrape(agents[node_agent])[0])
        check(ok, f"promtool check metrics after the recovery:\n{out}")
        # The Grafana dashboard names only metrics that exist.
        served = {n for a in [coord, *agents] for (n, _) in scrape(a)[1]}
        with open(os.path.join(os.environ.get("FTRUN_SOURCE_DIR", "."), "integration", "grafana", "ftrun.json")) as f:
            named = set(re.findall(r"ftrun_[a-z_]+", f.read()))
        check(named and not named - served, f"the dashboard names metrics nobody serves: {sorted(named - served)}")
    finally:
        rc = job.wait(timeout=120)
    check(rc == 0, f"runner exit {rc}\n{job.log[-3000:]}")


def test_a_taken_port_leaves_the_job_running_without_metrics(check):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        job = ClusterJob(1, 1, ["--state-bytes", "1MiB", "--steps", "20", "--step-ms", "10"],
                         config=f"metrics:\n  coordinator_listen: 127.0.0.1:{port}\n")
        rc = job.wait(timeout=120)
    finally:
        taken.close()
    check(rc == 0, f"runner exit {rc}\n{job.log[-3000:]}")
    check(f"cannot listen on 127.0.0.1:{port}" in job.log and "metrics.coordinator_listen" in job.log,
          f"no warning naming the address and the field:\n{job.log[-3000:]}")


if __name__ == "__main__":
    pytest.main([__file__, "-v"])
