// AgentView: what the agent's status file says (--status-file, see README),
// as plain data the agent gathers; AgentStatusJson formats it. The agent
// keeps no output format, and the format is tested without an agent.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/save_stalls.h"
#include "plugin/erasure/parity_exchange.h"
#include "plugin/replication/replicator.h"
#include "plugin/store/manifest.h"
#include "plugin/store/snapshot_store.h"
#include "plugin/transport/transport.h"

namespace ftrun {

struct AgentView {
  std::string job_id;
  pid_t agent_pid = 0;
  int node = 0;
  std::string state;  // running, stopping, idle, done

  // A multi-node job's agent.
  struct Cluster {
    int agent = 0;
    uint64_t epoch = 0;
    bool coordinator_connected = false;
    std::vector<uint32_t> holders;
    std::string address;
    TransportStats transport;
    std::deque<Replicator::Record> replication;
    // cluster.redundancy erasure: the parity held here (bytes) and the
    // contributions sent.
    std::optional<uint64_t> parity_bytes;  // the newest complete version's rows
    uint64_t parity_total_bytes = 0;       // every version's (blocks shared between them once)
    std::deque<ParityExchange::Record> parity;
  };
  std::optional<Cluster> cluster;

  int restarts = 0;
  int max_restarts = 0;
  std::optional<uint64_t> committed;
  StoreStats store;
  bool prefaulted = false;
  int store_fd = -1;
  uint64_t chunks_corrupt_found = 0;
  const SaveStalls* save_stalls = nullptr;  // the ranks' reports (none: nothing reported)
  uint64_t chunks_corrupt_repaired = 0;
  // This node's ranks' manifests of the committed version: a few chunks of
  // each are listed, where a test harness finds committed bytes.
  std::vector<const Manifest*> committed_manifests;
  size_t sampled_chunks = 4;              // per manifest
  std::optional<nlohmann::json> persist;  // the flusher's (flusher.h)

  struct Rank {
    int rank = 0;
    pid_t pid = 0;
    bool finished = false;
    bool connected = false;
    bool warm = false;  // its control link is up: it runs under @ftrun.resilient
  };
  std::vector<Rank> ranks;
  nlohmann::json recoveries = nlohmann::json::array();  // recovery_log.h's
  nlohmann::json warm = nlohmann::json::object();       // warm_ranks.h's standbys
  std::string rendezvous_store;                         // the generation's: the runner's, "" = rank 0's
  std::string metrics_address;                          // HOST:PORT of /metrics; "" = off
  std::optional<int> exit_code;                         // once done
};

nlohmann::json AgentStatusJson(const AgentView& v);

}  // namespace ftrun
