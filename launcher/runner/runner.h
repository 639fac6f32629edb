// Runner: the `ftrun` command's job. Selects the nodes (hostfile, --include,
// --num_nodes ...), generates the job id and the job secret, hosts the
// coordinator on a UCX transport, starts one ftrun-agent per node plus the
// spares, and runs until the coordinator ends the job.
//
// Launchers: `local` starts every agent on this machine (each its own
// "node": own store, own listen address, optionally wrapped by
// --agent_exec_prefix, e.g. `ip netns exec ns{node}`). A local agent that
// dies while the job runs is started again, as a spare when the job has
// spares (a spare took its node) or as its node otherwise (a rebooted node).
//
// Signals: SIGINT/SIGTERM stop the job (the coordinator tells every agent
// to stop its ranks), bounded by job.stop_grace plus 10 s; exit 128+signal.
// Otherwise the exit code is the coordinator's: 0, the failing rank's code,
// or 1 for a job that cannot go on (the message says why).
#pragma once

#include <string>

#include "launcher/runner/runner_options.h"
#include "plugin/config/config.h"

namespace ftrun {

int RunJob(const RunnerOptions& options);

// `ftrun --attach JOB [--config FILE]` (argv[0] is "--attach"): a runner
// for a job whose runner died while its agents live on (they fence their
// ranks and wait up to cluster.lost_node_timeout for a coordinator). It
// reads the job's first command line from <agent.run_dir>/JOB/runner.json,
// listens where the old coordinator did, adopts the agents; the coordinator
// re-learns the committed version from their catalogs and restarts every
// rank from it. Returns the process exit code.
int AttachJob(int argc, char** argv);

// With coordinator.etcd_endpoints (leadership.h): `ftrun
// --standby-coordinator JOB --config FILE [--coordinator_addr IP]` waits
// while another process leads the job; once the leader's etcd lease lapses
// it takes the job over as --attach does, from the state the leader kept in
// etcd (its command line, its agents), on its own address, which the agents
// read from etcd. Ends with the job's exit code (its end key), so a
// standby started by a scheduler ends with the job.
int StandbyCoordinator(int argc, char** argv);
// The loop behind it, also run by a runner that stepped down: campaign,
// lead, and on a step-down campaign again, until the job's end.
int FollowJob(const Config& config, const std::string& job, const std::string& coordinator_addr);

}  // namespace ftrun
