// ShardPulls with a recording pull (the replicator's side) and a
// ManualClock: each rank's holders are asked in turn, twice round; the node
// is ready once every shard arrived; a rank whose holders all failed, or a
// plan past the timeout, is reported once and the node never says ready.
#include "launcher/agent/shard_pulls.h"

#include "tests/catch.h"

namespace ftrun {
namespace {

struct Puller {
  ManualClock clock;
  struct Asked {
    PeerId holder;
    int rank;
    uint64_t version;
    uint64_t id;
  };
  std::vector<Asked> asked;
  std::vector<uint64_t> ready;
  std::vector<PullFailedMsg> failed;
  std::vector<std::pair<int, PeerId>> pulled;
  ShardPulls pulls{clock, std::chrono::milliseconds(5000), [this](PeerId h, int rank, uint64_t version) {
                     asked.push_back({h, rank, version, asked.size() + 100});
                     return asked.back().id;
                   }};
  Puller() {
    pulls.on_ready = [this](uint64_t epoch) { ready.push_back(epoch); };
    pulls.on_failed = [this](const PullFailedMsg& m) { failed.push_back(m); };
    pulls.on_pulled = [this](int rank, uint64_t, PeerId from) { pulled.push_back({rank, from}); };
  }
  // The last pull asked of `rank` ends with `s`.
  void End(int rank, const Status& s) {
    for (auto it = asked.rbegin(); it != asked.rend(); ++it) {
      if (it->rank == rank) return pulls.Ended(it->id, it->holder, rank, it->version, s);
    }
    FAIL("rank " << rank << " was never pulled");
  }
};

TEST_CASE("shard pulls: every shard from its first holder, then ready", "[pulls]") {
  Puller p;
  p.pulls.Begin(7);
  p.pulls.Add(4, 30, {2, 3});
  p.pulls.Add(5, 30, {3});
  p.pulls.Planned();
  REQUIRE(p.asked.size() == 2);
  CHECK((p.asked[0].holder == 2 && p.asked[0].rank == 4 && p.asked[0].version == 30));
  CHECK((p.asked[1].holder == 3 && p.asked[1].rank == 5));
  p.End(4, Status::Ok());
  CHECK(p.ready.empty());
  p.End(5, Status::Ok());
  CHECK(p.ready == std::vector<uint64_t>{7});
  CHECK(p.pulled == std::vector<std::pair<int, PeerId>>{{4, 2}, {5, 3}});
  CHECK(p.pulls.idle());
}

TEST_CASE("shard pulls: a plan with nothing to pull is ready at once", "[pulls]") {
  Puller p;
  p.pulls.Begin(3);
  p.pulls.Planned();
  CHECK(p.ready == std::vector<uint64_t>{3});
}

TEST_CASE("shard pulls: each holder is asked in turn, the list twice, then the coordinator hears it failed",
          "[pulls]") {
  Puller p;
  p.pulls.Begin(2);
  p.pulls.Add(0, 9, {5, 6});
  p.pulls.Add(1, 9, {6});
  p.pulls.Planned();
  for (int i = 0; i < 3; ++i) p.End(0, Status::Unavailable("connection reset"));
  std::vector<PeerId> order;
  for (const auto& a : p.asked) {
    if (a.rank == 0) order.push_back(a.holder);
  }
  CHECK(order == std::vector<PeerId>{5, 6, 5, 6});
  CHECK(p.failed.empty());
  p.End(0, Status::Unavailable("gone"));
  REQUIRE(p.failed.size() == 1);
  CHECK((p.failed[0].epoch == 2 && p.failed[0].rank == 0 && p.failed[0].version == 9));
  CHECK(p.failed[0].message == "gone");
  p.End(1, Status::Ok());  // the other rank arrives: never ready after a failure
  CHECK(p.ready.empty());
}

TEST_CASE("shard pulls: the end of a pull of an older plan, or of a holder asked before, is ignored", "[pulls]") {
  Puller p;
  p.pulls.Begin(1);
  p.pulls.Add(0, 9, {5, 6});
  const Puller::Asked first = p.asked.back();
  p.End(0, Status::Unavailable("reset"));                     // now asking holder 6
  p.pulls.Ended(first.id, first.holder, 0, 9, Status::Ok());  // the first pull's late end
  CHECK(p.pulled.empty());
  p.pulls.Begin(2);  // a new plan
  p.pulls.Add(0, 11, {6});
  p.pulls.Planned();
  p.pulls.Ended(p.asked[1].id, 6, 0, 9, Status::Ok());  // version 9's pull, of the old plan
  CHECK(p.ready.empty());
  p.End(0, Status::Ok());
  CHECK(p.ready == std::vector<uint64_t>{2});
}

TEST_CASE("shard pulls: a plan that does not finish within the timeout is reported once", "[pulls]") {
  Puller p;
  p.pulls.Begin(4);
  p.pulls.Add(3, 8, {1});
  p.pulls.Planned();
  p.clock.Advance(std::chrono::milliseconds(5000));
  p.pulls.Tick(p.clock.Now());
  CHECK(p.failed.empty());
  p.clock.Advance(std::chrono::milliseconds(1));
  p.pulls.Tick(p.clock.Now());
  p.pulls.Tick(p.clock.Now());
  REQUIRE(p.failed.size() == 1);
  CHECK((p.failed[0].epoch == 4 && p.failed[0].rank == 3 && p.failed[0].version == 8));
  CHECK(p.failed[0].message == "no answer from the holders within cluster.lost_node_timeout");
  p.End(3, Status::Ok());
  CHECK(p.ready.empty());
}

}  // namespace
}  // namespace ftrun
