// The agent and its coordinator (cluster_member.h reaches it and decodes
// its orders): what the agent registers as, and the orders it carries out
// that are not about starting and halting ranks (generations.h). For a
// one-node job the coordinator is hosted here (local_coordinator.h), so
// that every job commits and recovers through the same policy
// (recovery/coordinator.h).
#include <algorithm>

#include "launcher/agent/agent.h"
#include "plugin/common/log.h"

namespace ftrun {

ClusterMember::Options Agent::MemberOptions() {
  const Config& c = o_.config;
  ClusterMember::Options m;
  m.agent_id = o_.agent_id;
  m.coordinator = o_.coordinator;
  m.listen_ip = o_.listen_ip;
  m.secret_file = o_.secret_file;
  m.cluster = c.cluster;
  m.leader = c.coordinator;
  m.job_id = o_.job_id;
  m.chunk_size = c.store.chunk_size;
  if (remote()) return m;
  Coordinator::Options& co = m.local = Coordinator::Options::FromConfig(c);
  co.ranks_per_slot = {o_.local_ranks};
  co.first_rank = o_.first_global_rank;
  co.world_size = o_.world_size;
  co.replicas = 0;  // no other node to copy to, nor to code across
  co.erasure_data = co.erasure_parity = 0;
  co.master_port = o_.master_port;
  if (persist()) {
    // Scanned on the disk worker, as the runner does: the loop goes on.
    co.scan_disk = [this] {
      disk_recovery_->Scan([this](const Status& s, const std::vector<uint64_t>& versions) {
        member_->DiskScanned(s, versions, clock_.Now());
      });
    };
  }
  return m;
}

RegisterMsg Agent::Registration() {
  RegisterMsg m;
  // A one-node job's coordinator knows one node: its own ranks. (A remote
  // one's address is the transport's, set by the member.)
  m.slot = !remote() ? 0 : assigned_ ? o_.node_rank : (o_.spare ? -1 : o_.node_rank);
  m.address = o_.master_addr + ":0";  // the host part is the rendezvous address the start names
  m.rack = o_.rack;
  m.committed = store_.service()->last_committed();
  if (m.committed) {
    for (int rank : store_.catalog()->RanksAt(*m.committed)) m.catalog.push_back({rank, *m.committed});
  }
  return m;
}

void Agent::Assign(const AssignMsg& m) {
  if (!remote()) {
    // A one-node job's place in its world is its command line's
    // (--world_info, --node_rank): its own coordinator knows its ranks only.
    assigned_ = true;
    return;
  }
  if (const auto st = generations_->state();
      st == Generations::State::kRunning || st == Generations::State::kStopping) {
    FTRUN_LOG_ERROR("coordinator assigned node {} while ranks run; ignored", m.slot);
    return;
  }
  assigned_ = true;
  o_.node_rank = m.slot;
  o_.first_global_rank = m.first_rank;
  o_.local_ranks = m.local_ranks;
  o_.world_size = m.world_size;
  o_.num_nodes = m.num_slots;
  disk_->Assign(m.slot, m.world_size);
  if (static_cast<int>(o_.slots.size()) != m.local_ranks) {
    o_.slots.clear();
    for (int i = 0; i < m.local_ranks; ++i) o_.slots.push_back(i);
  }
  ranks_->Assign(m.first_rank, m.local_ranks);
  FTRUN_LOG_INFO("this agent is node {}: ranks {}..{} of {}", m.slot, m.first_rank, m.first_rank + m.local_ranks - 1,
                 m.world_size);
  status_dirty_ = true;
}

void Agent::Committed(uint64_t version) {
  store_.tracker()->Committed(version);
  store_.service()->OnCommitted(version);
}

void Agent::Commit(const CommitMsg& m) {
  commit_epoch_ = m.epoch;  // the timeline its disk markers record (NodeDisk::Committed)
  Committed(m.version);
  commit_epoch_.reset();
  status_dirty_ = true;
}

void Agent::DropAbove(uint64_t version) { disk_->DropFilesAbove(version, ranks_->Ranks()); }

// The disk's lease (node_disk.h): half the coordinator's silence before it
// declares a node lost. Once the coordinator ended the job nobody replaces
// this node: the drain may finish after it is gone.
void Agent::Heard(Clock::Time now) {
  const auto lease = o_.config.cluster.heartbeat_interval * o_.config.cluster.heartbeat_misses / 2;
  if (fenced_)
    disk_->EndLease();
  else if (stop_ordered_)
    disk_->LeaseForever();
  else
    disk_->LeaseUntil(now + lease);
}

void Agent::ShardPulled(int rank, uint64_t version, PeerId from) {
  corrupt_->Pulled(rank, version, "agent " + std::to_string(from));
}

// A chunk the replicator was to send is corrupted in our shared memory: as a
// rank's report, settled at once.
void Agent::CorruptToSend(int rank, uint64_t version, const ChunkRef& chunk) {
  corrupt_->FoundSending(rank, version, chunk);
  generations_->SettleCorruptChunks();
}

// (The member has joined the epoch and ended its commit round.)
void Agent::Halt(uint64_t epoch) {
  disk_recovery_->Cancel();  // a restore from disk in flight is stale now
  generations_->Halt(epoch);
}

// A restore is planned (the member pulls from the holders): this node is
// re-admitted, and a restore from disk in flight is stale. A plan from disk
// is this agent's to carry out.
void Agent::Readmitted(const PullMsg& m) {
  fenced_ = false;
  disk_recovery_->Cancel();
  if (m.from_disk) disk_recovery_->Pull(m);
}

// The link lost the coordinator (a transport error, or silence).
void Agent::Lost(const std::string& why) {
  // Until re-admitted (a pull or a start), another agent may take this node
  // and go back below what this one committed: no drain meanwhile. (After
  // the job's end was ordered the runner may simply have gone.)
  if (!stop_ordered_) {
    fenced_ = true;
    disk_->EndLease();
  }
  FTRUN_LOG_ERROR("lost the coordinator ({}): fencing this node's ranks until it is back", why);
  generations_->Lost(why);
}

// kStop (the job ends with `code`) or kFenced (this agent is out of it).
void Agent::Ended(int code, const std::string& msg, bool fenced) {
  if (fenced)
    fenced_ = true;  // never drains: its node is someone else's (NodeDisk::Drain)
  else
    stop_ordered_ = true;
  if (fenced)
    FTRUN_LOG_ERROR("fenced out of the job by the coordinator: {}", msg);
  else if (!remote()) {
  }  // the coordinator's own log line said it
  else if (code == 0)
    FTRUN_LOG_INFO("the coordinator ends the job: {}", msg);
  else
    FTRUN_LOG_ERROR("the coordinator stops the job: {}", msg);
  generations_->End(code, msg);
}

}  // namespace ftrun
