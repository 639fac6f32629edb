// ftrun's configuration: one YAML file parsed once into typed, validated
// structs. Nothing else in ftrun looks keys up by string.
//
// File layout (see configs/schema.md for every key):
//   job:   { id, max_restarts, hang_timeout, stop_grace, output_prefix }
//   store: { memory_budget, chunk_size, snapshot_bytes, prefault }
//   agent: { run_dir, log_level, ranks_per_node }
//   cluster: { replicas, redundancy, spares, heartbeat_interval, heartbeat_misses, lost_node_timeout,
//              copy_timeout }
//   persist: { dir, every_versions, every_seconds, keep, rate_limit, direct_io, drain_timeout }
//   restart: { warm_standbys, abort_timeout }
// Missing keys and sections take the defaults below; unknown keys, wrong node
// types and out-of-range values are errors.
//
// Errors are InvalidArgument (IoError for an unreadable file) with a message
// that names the file, the 1-based line, the dotted field and what was
// expected, e.g.
//   "configs/bad.yaml:7: store.memory_budget: expected a size like 4GiB or
//    512MiB, got '4 gigs' (...)"
// A config is plain data: copy it freely. All functions are thread-safe and
// never throw.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ftrun/status.h"
#include "plugin/config/default_run_dir.h"

namespace ftrun {

// Where a value came from. line and column are 1-based; line 0 means the
// value is a default, not read from a file.
struct SourceLoc {
  std::string file;
  int line = 0;
  int column = 0;
};

// "configs/x.yaml:12: store.memory_budget"; without a line
// "configs/x.yaml: store.memory_budget"; without a file
// "<default>: store.memory_budget". An empty field gives only the location.
std::string FormatLoc(const SourceLoc& loc, const std::string& field);

struct JobConfig {
  std::string id;                                 // job.id; "" = the agent generates one
  int max_restarts = 3;                           // job.max_restarts, >= 0
  std::chrono::milliseconds hang_timeout{60000};  // job.hang_timeout, > 0
  std::chrono::milliseconds stop_grace{5000};     // job.stop_grace, >= 0
  bool output_prefix = false;                     // job.output_prefix: "[rank N]: " before each line a rank writes
};

struct StoreConfig {
  uint64_t memory_budget = 4ull << 30;  // store.memory_budget, per node
  uint64_t chunk_size = 4ull << 20;     // store.chunk_size: power of two, 64KiB..1GiB
  uint64_t snapshot_bytes = 0;          // store.snapshot_bytes: one rank's snapshot; 0 = unknown
  bool prefault = true;                 // store.prefault
  SourceLoc memory_budget_loc;          // where memory_budget came from
};

struct AgentConfig {
  std::string run_dir = DefaultRunDir();  // agent.run_dir: sockets, locks, job dirs (default_run_dir.h)
  std::string log_level = "info";         // agent.log_level: trace|debug|info|warn|error
  int ranks_per_node = 1;                 // agent.ranks_per_node, >= 1 (the CLI may override)
};

// cluster.redundancy: {erasure: {data: D, parity: P}}: a Reed-Solomon code
// over groups of data + parity nodes (plugin/erasure/). Each node holds
// parity worth parity/data of its own state instead of full copies, and a
// group survives `parity` lost nodes.
struct ErasureConfig {
  // ReedSolomon::kMaxData and kMaxParity (plugin/erasure/reed_solomon.h),
  // repeated: the config library does not depend on the erasure library.
  static constexpr int kMaxData = 32;
  static constexpr int kMaxParity = 8;
  int data = 0;    // 1..kMaxData when on; 0 = off
  int parity = 0;  // 1..kMaxParity when on
  bool enabled() const { return data > 0; }
};

// Multi-node jobs (read by the runner's coordinator and every agent).
struct ClusterConfig {
  // cluster.replicas, or cluster.redundancy: {replicas: K}: full copies on
  // other nodes, >= 0; 0 with erasure (the code replaces the copies).
  int replicas = 1;
  ErasureConfig erasure;                               // cluster.redundancy: {erasure: ...}; off by default
  SourceLoc redundancy_loc;                            // where cluster.redundancy (or cluster.replicas) was set
  int spares = 0;                                      // cluster.spares: agents without ranks, >= 0
  std::chrono::milliseconds heartbeat_interval{200};   // cluster.heartbeat_interval, > 0
  int heartbeat_misses = 10;                           // cluster.heartbeat_misses, >= 1
  std::chrono::milliseconds lost_node_timeout{60000};  // cluster.lost_node_timeout, > 0
  std::chrono::milliseconds copy_timeout{5000};        // cluster.copy_timeout, > 0: a copy between agents
                                                       // with no progress that long is cancelled
};

// Committed versions written lazily to disk (plugin/persist/). A version is
// written when every_versions committed versions or every_seconds have
// passed since the last one written, whichever comes first.
struct PersistConfig {
  std::string dir;                                  // persist.dir: root directory; "" = off
  int every_versions = 0;                           // persist.every_versions, >= 0; 0 = not by count
  std::chrono::milliseconds every_seconds{300000};  // persist.every_seconds (a duration), >= 0; 0s = not by time
  int keep = 2;                                     // persist.keep: complete versions kept on disk, >= 1
  uint64_t rate_limit = 0;                          // persist.rate_limit: bytes/s; 0 = unlimited, else >= 1MiB
  bool direct_io = true;                            // persist.direct_io: O_DIRECT where the filesystem takes it
  std::chrono::milliseconds drain_timeout{60000};   // persist.drain_timeout: on a clean stop, wait this long
                                                    // for the last committed version to reach disk; 0s = no wait
  // persist.file_mode: the mode of every file ftrun writes there, 0600 (the
  // job's user only; default), 0640 or 0660 (its group may read, or read and
  // write: a group-shared directory). Directories get the same with x where
  // r is set (0700, 0750, 0770).
  uint32_t file_mode = 0600;
  SourceLoc dir_loc;  // where dir came from
};

// Warm recovery (launcher/agent/warm_ranks.h): ranks that run under
// @ftrun.resilient survive a failure in their own processes, and warm
// standbys take the dead ranks' places.
struct RestartConfig {
  static constexpr int kAuto = -1;
  // restart.warm_standbys: standby processes per node, >= 0, or auto (-1):
  // one on a node whose ranks use the decorator, none on a spare.
  int warm_standbys = kAuto;
  // restart.abort_timeout: how long a survivor may take to leave its
  // generation (out of the decorated function) before it is killed and
  // replaced like a dead rank, > 0.
  std::chrono::milliseconds abort_timeout{5000};
};

// Prometheus /metrics endpoints (launcher/common/metrics_endpoint.h):
// "HOST:PORT" to listen on (port 0: any free one, named in the status
// file), "" = off.
struct MetricsConfig {
  std::string agent_listen;                        // metrics.agent_listen: each agent's; off by default
  std::string coordinator_listen = "127.0.0.1:0";  // metrics.coordinator_listen: the runner's
};

// A control plane that fails over by itself (launcher/runner/leadership.h):
// with etcd endpoints set, the coordinator holds its job's leadership
// through an etcd lease, standby coordinators (`ftrun
// --standby-coordinator JOB`) take over when it lapses, and agents find the
// leader through etcd. Without them: the runner's embedded coordinator.
struct CoordinatorConfig {
  // coordinator.etcd_endpoints: comma-separated http:// or https:// URLs of
  // etcd's client ports; "" = no etcd.
  std::vector<std::string> etcd_endpoints;
  std::string etcd_prefix = "/ftrun";              // coordinator.etcd_prefix: the job's keys go under PREFIX/JOB/
  std::chrono::milliseconds etcd_lease_ttl{5000};  // coordinator.etcd_lease_ttl: 2s to 300s, whole seconds
  std::string etcd_ca_file, etcd_cert_file, etcd_key_file;  // coordinator.etcd_*_file: TLS (cert and key together)
};

struct Config {
  std::string source;  // file path, or "<default>"
  JobConfig job;
  StoreConfig store;
  AgentConfig agent;
  ClusterConfig cluster;
  PersistConfig persist;
  RestartConfig restart;
  MetricsConfig metrics;
  CoordinatorConfig coordinator;
};

// Parses and validates `yaml_text`; `source_name` is used in messages and as
// Config::source. *out is written only on success. An empty document gives
// the defaults.
Status ParseConfig(const std::string& yaml_text, const std::string& source_name, Config* out);

// Reads `path` and calls ParseConfig with it as the source name. A file that
// cannot be read gives IoError naming the path and strerror.
Status LoadConfigFile(const std::string& path, Config* out);

// Every field at its default; source "<default>".
Config DefaultConfig();

// Checks every field's range and the cross-field rules (the budget holds two
// snapshots of every rank; the budget holds at least one chunk; a persist dir
// needs a trigger). Call it again
// after overriding fields, e.g. ranks_per_node from the command line.
Status ValidateConfig(const Config& config);

// The rules of a multi-node job: fewer replicas than nodes, or with erasure
// a node count that is a multiple of data + parity; and a budget that holds
// the node's own snapshots and the copies (or parity) it keeps for others.
// With one node the redundancy is not checked: there is no peer.
Status ValidateClusterConfig(const Config& config, int num_nodes);

// Why `nodes` nodes cannot form erasure groups of data + parity ("" when
// they can): the one rule for the runner's check and for placement.
std::string ErasureGroupError(int nodes, int data, int parity);

// Advice on a valid config that will cost a big job (empty when none): at
// thousands of nodes, heartbeats under 500 ms are most of the coordinator's
// messages, and a longer interval with fewer misses keeps the same timeout.
std::string ClusterConfigAdvice(const Config& config, int num_nodes);

}  // namespace ftrun
