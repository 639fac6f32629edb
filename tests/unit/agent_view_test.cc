// AgentStatusJson: the status file's format (README, --status-file), read
// by ftrun status, the chaos harness and the benchmarks.
#include "launcher/agent/agent_view.h"

#include <unistd.h>

#include "tests/catch.h"

namespace ftrun {
namespace {

Manifest Shard(int rank, uint64_t version, int tensors, int chunks) {
  Manifest m;
  m.rank = rank;
  m.version = version;
  for (int t = 0; t < tensors; ++t) {
    TensorManifest tm;
    tm.info.name = "t" + std::to_string(t);
    for (int c = 0; c < chunks; ++c) {
      ChunkRef r;
      r.hash = {static_cast<uint64_t>(t * 100 + c), 7};
      r.length = 4096;
      r.offset = 4096u * static_cast<uint64_t>(t * chunks + c);
      tm.chunks.push_back(r);
    }
    m.tensors.push_back(tm);
  }
  return m;
}

TEST_CASE("agent status: a one-node agent's file", "[agent_view]") {
  AgentView v;
  v.job_id = "j";
  v.agent_pid = ::getpid();
  v.node = 0;
  v.state = "running";
  v.restarts = 1;
  v.max_restarts = 3;
  v.committed = 12;
  v.store.capacity_bytes = 1 << 20;
  v.chunks_corrupt_found = 2;
  v.chunks_corrupt_repaired = 1;
  Manifest a = Shard(0, 12, 2, 8), b = Shard(1, 12, 1, 1);
  v.committed_manifests = {&a, &b};
  v.ranks = {{0, ::getpid(), false, true, true}, {1, 0, true, false, false}};
  nlohmann::json j = AgentStatusJson(v);
  CHECK(j["job_id"] == "j");
  CHECK(j["agent_pid"] == ::getpid());
  CHECK(j["agent_start_time"].is_number());
  CHECK(j["state"] == "running");
  CHECK(j.count("epoch") == 0);  // no cluster
  CHECK(j["committed_version"] == 12);
  CHECK(j["store"]["chunks_corrupt_found"] == 2);
  CHECK(j["store"]["chunks_corrupt_repaired"] == 1);
  // Four chunks of rank 0, spread over both tensors; rank 1's only chunk once.
  const auto& sample = j["store"]["committed_chunks"];
  REQUIRE(sample.size() == 5);
  CHECK(sample[0]["tensor"] == "t0");
  CHECK(sample[0]["chunk"] == 0);
  CHECK(sample[1]["tensor"] == "t0");
  CHECK(sample[1]["chunk"] == 2);
  CHECK(sample[2]["tensor"] == "t1");
  CHECK(sample[2]["chunk"] == 4);
  CHECK(sample[3]["tensor"] == "t1");
  CHECK(sample[3]["chunk"] == 6);
  CHECK(sample[4]["rank"] == 1);
  CHECK(sample[4]["offset"] == 0);
  CHECK(sample[4]["hash"] == a.tensors[0].chunks[0].hash.ToHex());
  REQUIRE(j["ranks"].size() == 2);
  CHECK(j["ranks"][0]["connected"] == true);
  CHECK(j["ranks"][0]["warm"] == true);
  CHECK(j["ranks"][1]["warm"] == false);
  CHECK(j["ranks"][1]["finished"] == true);
  CHECK(j["ranks"][1]["start_time"] == 0);  // no process
  CHECK(j["recoveries"].empty());
  CHECK(j["exit_code"].is_null());
  CHECK(j.count("persist") == 0);
}

TEST_CASE("agent status: a cluster agent's file names its place, holders and copies", "[agent_view]") {
  AgentView v;
  v.state = "done";
  v.exit_code = 0;
  AgentView::Cluster c;
  c.agent = 3;
  c.epoch = 5;
  c.coordinator_connected = true;
  c.holders = {1, 2};
  c.address = "10.0.0.1:4000";
  c.transport.bulk_bytes_sent = 100;
  c.replication.push_back({1, 6, 40, 1000, 100, 0.5});
  v.cluster = c;
  v.persist = nlohmann::json{{"last_written", 4}};
  nlohmann::json j = AgentStatusJson(v);
  CHECK(j["agent"] == 3);
  CHECK(j["epoch"] == 5);
  CHECK(j["holders"] == nlohmann::json({1, 2}));
  CHECK(j["bulk_bytes_sent"] == 100);
  REQUIRE(j["replication"].size() == 1);
  CHECK(j["replication"][0]["to"] == 1);
  CHECK(j["replication"][0]["bytes_sent"] == 100);
  CHECK(j["persist"]["last_written"] == 4);
  CHECK(j["exit_code"] == 0);
  CHECK(j["committed_version"].is_null());
}

}  // namespace
}  // namespace ftrun
