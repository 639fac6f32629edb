// The agent's status file (--status-file): ranks, store, committed version,
// every recovery with its breakdown (see README).
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "launcher/agent/agent.h"
#include "launcher/agent/rank_env.h"
#include "plugin/common/bytes.h"
#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "plugin/common/proc_start.h"
#include "plugin/common/safe_dir.h"
#include "plugin/persist/persist_reader.h"

namespace ftrun {
namespace {

// Up to `n` chunks of m, spread over its tensors and over the chunks within
// them (always the same ones): where a test harness finds committed bytes.
nlohmann::json SampleChunks(const Manifest& m, size_t n) {
  nlohmann::json out = nlohmann::json::array();
  std::set<std::pair<size_t, size_t>> taken;
  const size_t tensors = m.tensors.size();
  for (size_t k = 0; k < n && tensors > 0; ++k) {
    const size_t t = k * tensors / n;
    const auto& chunks = m.tensors[t].chunks;
    if (chunks.empty()) continue;
    const size_t j = (k * chunks.size() / n) % chunks.size();
    if (!taken.insert({t, j}).second) continue;
    const ChunkRef& c = chunks[j];
    out.push_back({{"rank", m.rank},
                   {"version", m.version},
                   {"tensor", m.tensors[t].info.name},
                   {"chunk", j},
                   {"offset", c.offset},
                   {"bytes", c.length},
                   {"hash", c.hash.ToHex()}});
  }
  return out;
}

}  // namespace

void Agent::WriteStatus() {
  status_dirty_ = false;
  last_status_write_ = clock_.Now();
  if (o_.status_file.empty()) return;
  using nlohmann::json;
  json j;
  j["job_id"] = o_.job_id;
  j["agent_pid"] = static_cast<int>(::getpid());
  j["agent_start_time"] = ProcessStartTime(::getpid());  // with every pid: see proc_start.h
  j["node"] = o_.node_rank;
  const char* states[] = {"running", "stopping", "idle", "done"};
  j["state"] = states[static_cast<int>(state_)];
  if (remote()) {
    j["agent"] = o_.agent_id;
    j["epoch"] = epoch_;
    j["coordinator_connected"] = CoordinatorUp();
    j["holders"] = replicator_->holders();
    j["address"] = transport_->address();
    TransportStats ts = transport_->stats();
    j["bulk_bytes_sent"] = ts.bulk_bytes_sent;
    j["bulk_bytes_received"] = ts.bulk_bytes_received;
    j["replication"] = json::array();
    for (const auto& r : replicator_->history()) {
      j["replication"].push_back({{"to", r.to},
                                  {"rank", r.rank},
                                  {"version", r.version},
                                  {"state_bytes", r.state_bytes},
                                  {"bytes_sent", r.bytes_sent},
                                  {"seconds", r.seconds}});
    }
  }
  j["restarts"] = generation_;
  j["max_restarts"] = o_.config.job.max_restarts;
  auto committed = service_->last_committed();
  j["committed_version"] = committed ? json(*committed) : json(nullptr);
  StoreStats st = store_->Stats();
  reported_prefaulted_ = prefaulted_;
  j["store"] = {{"capacity_bytes", st.capacity_bytes},
                {"used_bytes", st.used_bytes},
                {"reserved_bytes", st.reserved_bytes},
                {"chunks", st.chunks},
                {"versions", st.versions},
                {"prefaulted", reported_prefaulted_},
                {"store_fd", arena_.fd()},
                {"chunks_corrupt_found", corrupt_->found()},
                {"chunks_corrupt_repaired", corrupt_->repaired()}};
  json sample = json::array();
  for (const RankSlot& s : ranks_->slots()) {
    const Manifest* m = committed ? store_->Find(s.global_rank, *committed) : nullptr;
    if (m != nullptr) {
      for (auto& c : SampleChunks(*m, kSampledChunks)) sample.push_back(std::move(c));
    }
  }
  j["store"]["committed_chunks"] = std::move(sample);
  if (auto p = disk_->StatusJson()) j["persist"] = std::move(*p);
  j["ranks"] = json::array();
  for (const RankSlot& s : ranks_->slots()) {
    j["ranks"].push_back({{"rank", s.global_rank},
                          {"pid", s.pid},
                          {"start_time", ProcessStartTime(s.pid)},
                          {"finished", s.finished},
                          {"connected", s.conn_id != 0}});
  }
  j["recoveries"] = recoveries_->ToJson();
  j["exit_code"] = state_ == State::kDone ? json(exit_code_) : json(nullptr);
  // Never through a link; inside the run dir (the runner's job dir), only in
  // a directory nobody else can write (safe_dir.h).
  const std::string& run_dir = o_.config.agent.run_dir;
  const bool in_run_dir = o_.status_file.compare(0, run_dir.size() + 1, run_dir + "/") == 0;
  Status s = ReplaceFile(o_.status_file, j.dump(2) + "\n", in_run_dir);
  if (!s.ok() && s.message() != status_error_) FTRUN_LOG_WARN("cannot write status file: {}", s.message());
  status_error_ = s.ok() ? std::string() : s.message();
}

}  // namespace ftrun
