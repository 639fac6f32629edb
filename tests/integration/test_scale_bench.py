"""ftrun-bench scale runs the real coordinator against a small simulated
fleet, in-process (calibrated against UCX) and over UCX (the coordinator in
a process of its own): every version saved is committed, a silent node is
noticed and recovered from (a spare takes it, every node gets the new
epoch's start), then a dead one, and a bad flag is refused naming it. No
timing is asserted (the figures are in docs/benchmarks.md)."""
import json
import os
import subprocess

import pytest

from ftrun_testlib import BUILD

BENCH = os.path.join(BUILD, "ftrun-bench")


@pytest.mark.parametrize("transport", ["inprocess", "ucx"])
def test_small_fleet_commits_and_recovers(check, scratch, transport):
    out = os.path.join(scratch("ftrun-scale-"), "scale.json")
    p = subprocess.run([BENCH, "scale", "--nodes", "24", "--ranks-per-node", "4", "--seconds", "3",
                        "--heartbeat-ms", "50", "--misses", "4", "--transport", transport,
                        "--calibrate-nodes", "12", "--json", out],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"ftrun-bench scale exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    with open(out) as f:
        result = json.load(f)
    figures = {name: f["value"] for name, f in result["figures"].items()}
    details = result["details"]
    check(details["versions"] >= 2, f"versions saved: {details['versions']}")
    check(figures["versions_uncommitted"] == 0, f"every version committed: {figures}")
    check(len(details["commit_latencies_ms"]) == details["versions"], "a commit latency per version")
    check(details["recovery_epochs"] >= 1, "the silent node's recovery moved the job to a new epoch")
    # Noticed no earlier than the heartbeat timeout after its last message.
    check(figures["silent_detect_over_timeout_ms"] >= 0, f"noticed before its timeout: {figures}")
    check(figures["recovery_orders_ms"] >= figures["halt_delivered_ms"] >= 0, f"orders after halts: {figures}")
    check(figures["dead_node_orders_ms"] >= figures["dead_node_noticed_ms"] >= 0, f"the dead node: {figures}")
    check(details["recovery_epochs"] >= 1 and figures["dead_node_orders_ms"] > 0, f"{figures}")
    check(figures["coordinator_cpu_cores"] > 0, f"the coordinator's CPU was measured: {figures}")
    if transport == "inprocess":
        # Priced from the same fleet run over UCX (its coordinator's own
        # process measured) and in-process.
        cal = details["ucx_calibration"]
        check(cal["nodes"] == 12, f"calibration: {cal}")
        check(cal["messages_per_s"] > 0 and cal["cpu_cores_ucx"] > 0, f"the UCX fleet ran: {cal}")
    else:
        check(details["transport"].startswith("ucx"), details["transport"])


def test_bad_flags_are_refused(check):
    p = subprocess.run([BENCH, "scale", "--nodes", "1"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2, f"exit {p.returncode}")
    check("--nodes >= 4" in p.stderr, p.stderr)
    p = subprocess.run([BENCH, "scale", "--transport", "tcp"], capture_output=True, text=True, timeout=30)
    check(p.returncode != 0 and "--transport" in p.stdout + p.stderr, p.stdout + p.stderr)
