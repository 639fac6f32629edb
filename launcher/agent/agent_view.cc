#include "launcher/agent/agent_view.h"

#include <set>
#include <utility>

#include "plugin/common/proc_start.h"

namespace ftrun {
namespace {

// Up to `n` chunks of m, spread over its tensors and over the chunks within
// them (always the same ones).
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

nlohmann::json AgentStatusJson(const AgentView& v) {
  using nlohmann::json;
  json j;
  j["job_id"] = v.job_id;
  j["agent_pid"] = static_cast<int>(v.agent_pid);
  j["agent_start_time"] = ProcessStartTime(v.agent_pid);  // with every pid: see proc_start.h
  j["node"] = v.node;
  j["state"] = v.state;
  if (v.cluster) {
    const AgentView::Cluster& c = *v.cluster;
    j["agent"] = c.agent;
    j["epoch"] = c.epoch;
    j["coordinator_connected"] = c.coordinator_connected;
    j["holders"] = c.holders;
    j["address"] = c.address;
    j["bulk_bytes_sent"] = c.transport.bulk_bytes_sent;
    j["bulk_bytes_received"] = c.transport.bulk_bytes_received;
    j["replication"] = json::array();
    for (const auto& r : c.replication) {
      j["replication"].push_back({{"to", r.to},
                                  {"rank", r.rank},
                                  {"version", r.version},
                                  {"state_bytes", r.state_bytes},
                                  {"bytes_sent", r.bytes_sent},
                                  {"seconds", r.seconds}});
    }
    if (c.parity_bytes) {
      json e = {{"parity_bytes", *c.parity_bytes},
                {"parity_total_bytes", c.parity_total_bytes},
                {"contributions", json::array()}};
      for (const auto& r : c.parity) {
        e["contributions"].push_back({{"version", r.version},
                                      {"from_zeros", r.from_zeros},
                                      {"shard_bytes", r.shard_bytes},
                                      {"changed_bytes", r.changed_bytes},
                                      {"full_holders", r.full_holders},
                                      {"bytes_sent", r.bytes_sent},
                                      {"seconds", r.seconds}});
      }
      j["erasure"] = e;
    }
  }
  j["restarts"] = v.restarts;
  j["max_restarts"] = v.max_restarts;
  j["committed_version"] = v.committed ? json(*v.committed) : json(nullptr);
  j["store"] = {{"capacity_bytes", v.store.capacity_bytes},
                {"used_bytes", v.store.used_bytes},
                {"reserved_bytes", v.store.reserved_bytes},
                {"chunks", v.store.chunks},
                {"versions", v.store.versions},
                {"prefaulted", v.prefaulted},
                {"store_fd", v.store_fd},
                {"chunks_corrupt_found", v.chunks_corrupt_found},
                {"chunks_corrupt_repaired", v.chunks_corrupt_repaired}};
  json sample = json::array();
  for (const Manifest* m : v.committed_manifests) {
    for (auto& c : SampleChunks(*m, v.sampled_chunks)) sample.push_back(std::move(c));
  }
  j["store"]["committed_chunks"] = std::move(sample);
  if (v.persist) j["persist"] = *v.persist;
  j["ranks"] = json::array();
  for (const AgentView::Rank& r : v.ranks) {
    j["ranks"].push_back({{"rank", r.rank},
                          {"pid", r.pid},
                          {"start_time", ProcessStartTime(r.pid)},
                          {"finished", r.finished},
                          {"connected", r.connected},
                          {"warm", r.warm}});
  }
  if (v.save_stalls != nullptr) {
    j["save_stalls"] = {{"count", v.save_stalls->count()},
                        {"sum_s", v.save_stalls->sum_seconds()},
                        {"max_s", v.save_stalls->max_seconds()}};
  }
  j["recoveries"] = v.recoveries;
  j["warm_standbys"] = v.warm;
  j["rendezvous_store"] = v.rendezvous_store;
  j["metrics_address"] = v.metrics_address;
  j["exit_code"] = v.exit_code ? json(*v.exit_code) : json(nullptr);
  return j;
}

}  // namespace ftrun
