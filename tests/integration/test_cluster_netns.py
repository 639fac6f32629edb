"""Multi-node over real links: each agent in its own network namespace, UCX
over tcp on veth links, the coordinator in the root namespace on the
bridge. A node's link goes down mid-run: no UCX error comes for a long
time, so the heartbeats find it lost; the spare takes over (from the
replicas of 4 nodes x 2 ranks; or, under a 4+2 erasure code, two links of
the group at once, each node rebuilt from the four survivors) and training
ends with the failure-free digests. The link then comes back: the old
agent is fenced (its ranks and its uncommitted versions never mix into the
job again)."""
import os
import time

from ftrun_chaos import netns_cluster as nc
from ftrun_testlib import ClusterJob, digests, golden, require_netns, seeded_rng

NODES, PER_NODE = 4, 2
ARGS = ["--state-bytes", "8MiB", "--tensors", "4", "--steps", "150", "--step-ms", "15", "--change-fraction", "0.3"]
CONFIG = ("job:\n  max_restarts: 5\n  stop_grace: 2s\n"
          "store:\n  memory_budget: 256MiB\n  chunk_size: 1MiB\n  prefault: false\n"
          "cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 10\n  lost_node_timeout: 30s\n")


def netns_job(c, nodes, per_node, spares, args, config):
    """The job on `c`'s namespaces: node i's agent in namespace i, the spares after the nodes."""
    env = os.environ.copy()
    env["UCX_TLS"] = "tcp,self"  # else UCX uses shared memory across namespaces and the link does not matter
    env["UCX_NET_DEVICES"] = c.bridge  # the coordinator's; each agent gets its veth below
    prefix = c.exec_prefix_template + " env UCX_NET_DEVICES=veth{node}"
    addrs = ",".join(c.addr(i) for i in range(nodes + spares))
    return ClusterJob(nodes, per_node, args, config, spares=spares,
                      extra=["--coordinator_addr", c.root_addr, "--agent_addr", addrs, "--agent_exec_prefix", prefix],
                      env=env)


def test_link_down_then_back(check):
    """A node's link goes down: the spare takes over and the job ends with the failure-free digests; the link
    comes back and the old agent is fenced."""
    require_netns()
    rng = seeded_rng()
    want = golden(NODES * PER_NODE, ARGS)

    with nc.NetnsCluster(NODES + 1) as c:
        job = netns_job(c, NODES, PER_NODE, 1, ARGS, CONFIG)
        st = job.wait_for(lambda s: s["phase"] == "running" and s["committed_version"] is not None, timeout=60)
        check(st is not None, "netns: the job never committed a version\n" + open(job.out.name).read()[-3000:])
        victim = rng.randrange(NODES)
        if st:
            time.sleep(rng.uniform(0.1, 0.4))
            print(f"link of node {victim} down", flush=True)
            c.link_down(victim)
            st = job.wait_for(lambda s: s["restarts"] >= 1 and s["phase"] == "running", timeout=30)
            check(st is not None, "netns: no recovery after the link went down")
            if st:
                check(st["nodes"][victim]["agent"] != victim, "netns: the lost node was not taken over by the spare")
            time.sleep(0.5)
            print(f"link of node {victim} up", flush=True)
            c.link_up(victim)
        rc = job.wait(timeout=240)
        check(rc == 0, f"netns: runner exit {rc}\n{job.log[-4000:]}")
        check(digests(job.log) == want, "netns: digests differ from the failure-free run")
        check("fenced" in job.log, "netns: the agent that came back was not fenced")


EC_ARGS = ["--state-bytes", "8MiB", "--tensors", "4", "--steps", "120", "--step-ms", "15", "--change-fraction", "0.3"]
EC_CONFIG = CONFIG.replace("replicas: 1", "redundancy: {erasure: {data: 4, parity: 2}}")


def test_erasure_two_links_down_at_once(check):
    """Under a 4+2 code, 6 nodes x 1 rank and 2 spares: two nodes' links go down at once; each is rebuilt on a
    spare from the four survivors over the veth links, and the job ends with the failure-free digests."""
    require_netns()
    rng = seeded_rng()
    nodes, spares = 6, 2
    want = golden(nodes, EC_ARGS)

    with nc.NetnsCluster(nodes + spares) as c:
        job = netns_job(c, nodes, 1, spares, EC_ARGS, EC_CONFIG)
        st = job.wait_for(lambda s: s["phase"] == "running" and s["committed_version"] is not None, timeout=90)
        check(st is not None, "netns 4+2: the job never committed a version\n" + open(job.out.name).read()[-3000:])
        victims = rng.sample(range(nodes), 2)
        if st:
            time.sleep(rng.uniform(0.1, 0.4))
            print(f"links of nodes {victims} down", flush=True)
            for v in victims:
                c.link_down(v)
            st = job.wait_for(lambda s: s["restarts"] >= 1 and s["phase"] == "running" and
                              all(s["nodes"][v]["agent"] not in (None, v) for v in victims), timeout=60)
            check(st is not None, "netns 4+2: the two lost nodes were not both taken over by the spares\n" +
                  open(job.out.name).read()[-3000:])
            for v in victims:
                c.link_up(v)
        rc = job.wait(timeout=240)
        check(rc == 0, f"netns 4+2: runner exit {rc}\n{job.log[-4000:]}")
        check(digests(job.log) == want, "netns 4+2: digests differ from the failure-free run")
        check(job.log.count("from the erasure group, every chunk checked") >= 2,
              "netns 4+2: the two nodes were not both rebuilt from the group")
