// RecoveryLog on a ManualClock: each restart's phases, from the failure to
// every rank's first step; a replacement's own record; a restart that never
// came is no recovery.
#include "launcher/agent/recovery_log.h"

#include "tests/catch.h"

namespace ftrun {
namespace {

using std::chrono::milliseconds;

TEST_CASE("recovery log: a restart timed phase by phase, in the status's terms", "[recovery_log]") {
  ManualClock clock;
  RecoveryLog log(clock);
  log.Failed(1, "rank 2 killed by signal 9");
  clock.Advance(milliseconds(300));
  log.Stopped();
  clock.Advance(milliseconds(50));
  log.Starting(1, 41, "taking over node 0", 3);
  log.Spawned(1, clock.Now(), {0, 0, 2});
  clock.Advance(milliseconds(20));
  log.AllRanks(1, RecoveryLog::Phase::kConnected, clock.Now());
  clock.Advance(milliseconds(100));
  log.AllRanks(0, RecoveryLog::Phase::kRestored, clock.Now());  // another generation's: ignored
  log.AllRanks(1, RecoveryLog::Phase::kRestored, clock.Now());
  clock.Advance(milliseconds(500));
  log.AllRanks(1, RecoveryLog::Phase::kFirstStep, clock.Now());

  REQUIRE(log.records().size() == 1);
  nlohmann::json j = log.ToJson();
  REQUIRE(j.size() == 1);
  CHECK(j[0]["restart"] == 1);
  CHECK(j[0]["reason"] == "rank 2 killed by signal 9");
  CHECK(j[0]["version"] == 41);
  CHECK(j[0]["stop_ms"] == 300);
  CHECK(j[0]["respawn_ms"] == 50);
  CHECK(j[0]["connect_ms"] == 20);
  CHECK(j[0]["restore_ms"] == 100);
  CHECK(j[0]["first_step_ms"] == 500);
  CHECK(j[0]["total_ms"] == 970);
  CHECK(j[0]["first_step_mono_ns"].get<int64_t>() - j[0]["detected_mono_ns"].get<int64_t>() == 970000000);
}

TEST_CASE("recovery log: a node that stopped nothing gets a record when it starts ranks in a restart",
          "[recovery_log]") {
  ManualClock clock;
  RecoveryLog log(clock);
  log.Starting(0, std::nullopt, "taking over node 1", 3);  // the job's first start: no recovery
  CHECK(log.records().empty());
  log.Starting(2, 7, "", 3);  // a spare with no ranks
  CHECK(log.records().empty());
  log.Starting(2, 7, "taking over node 1", 3);
  REQUIRE(log.records().size() == 1);
  CHECK(log.records()[0].reason == "taking over node 1");
  CHECK(log.records()[0].version == std::optional<uint64_t>(7));
  CHECK(log.ToJson()[0].count("total_ms") == 0);  // not recovered yet
}

TEST_CASE("recovery log: a restart that never came is no recovery", "[recovery_log]") {
  ManualClock clock;
  RecoveryLog log(clock);
  log.Failed(1, "rank 0 exited with code 3");
  log.Stopped();
  log.Abandoned();  // the coordinator ended the job instead
  CHECK(log.records().empty());
  log.Failed(1, "rank 0 exited with code 3");
  log.Starting(1, std::nullopt, "", 3);
  log.Spawned(1, clock.Now(), {0, 0, 2});
  log.Abandoned();  // spawned: it was a recovery
  CHECK(log.records().size() == 1);
  CHECK(log.ToJson()[0]["version"].is_null());
}

}  // namespace
}  // namespace ftrun
