// The `cluster` section and the multi-node rules: bad values name the file,
// the line, the field and what was expected.
#include <catch2/catch.hpp>

#include "plugin/config/config.h"

namespace ftrun {

TEST_CASE("cluster config: values parse, bad ones name file:line and field", "[config]") {
  Config c;
  REQUIRE(ParseConfig("cluster:\n  replicas: 2\n  spares: 1\n  heartbeat_interval: 50ms\n  heartbeat_misses: 4\n"
                      "  lost_node_timeout: 2m\n",
                      "x.yaml", &c)
              .ok());
  REQUIRE(c.cluster.replicas == 2);
  REQUIRE(c.cluster.spares == 1);
  REQUIRE(c.cluster.heartbeat_interval.count() == 50);
  REQUIRE(c.cluster.heartbeat_misses == 4);
  REQUIRE(c.cluster.lost_node_timeout.count() == 120000);

  Status s = ParseConfig("job:\n  max_restarts: 1\ncluster:\n  replicas: -1\n", "x.yaml", &c);
  REQUIRE(s.message().find("x.yaml:4") != std::string::npos);
  REQUIRE(s.message().find("cluster.replicas") != std::string::npos);
  s = ParseConfig("cluster:\n  heartbeat_interval: fast\n", "x.yaml", &c);
  REQUIRE(s.message().find("cluster.heartbeat_interval") != std::string::npos);
  REQUIRE(s.message().find("duration") != std::string::npos);
  s = ParseConfig("cluster:\n  heartbeat_misses: 0\n", "x.yaml", &c);
  REQUIRE(s.message().find("cluster.heartbeat_misses") != std::string::npos);
  s = ParseConfig("cluster:\n  replica: 1\n", "x.yaml", &c);
  REQUIRE(!s.ok());
  REQUIRE(s.message().find("replica") != std::string::npos);
}

TEST_CASE("cluster config: replicas below the node count, budget for the copies kept", "[config]") {
  Config c = DefaultConfig();
  c.cluster.replicas = 2;
  Status s = ValidateClusterConfig(c, 2);
  REQUIRE(s.message().find("cluster.replicas") != std::string::npos);
  REQUIRE(s.message().find("at least 3 nodes") != std::string::npos);
  REQUIRE(ValidateClusterConfig(c, 3).ok());
  c.store.memory_budget = 1ull << 30;
  c.store.snapshot_bytes = 256ull << 20;
  c.agent.ranks_per_node = 1;
  s = ValidateClusterConfig(c, 4);  // 2 x 1 x 3 x 256 MiB = 1.5 GiB > 1 GiB
  REQUIRE(s.message().find("store.memory_budget") != std::string::npos);
  REQUIRE(s.message().find("3 copies") != std::string::npos);
  c.cluster.replicas = 0;
  REQUIRE(ValidateClusterConfig(c, 4).ok());
}

TEST_CASE("cluster config: a persist dir on several nodes needs persist.every_versions", "[config]") {
  Config c;
  REQUIRE(ParseConfig("persist:\n  dir: /p\n  every_seconds: 30s\n", "x.yaml", &c).ok());
  REQUIRE(ValidateClusterConfig(c, 1).ok());  // one node: time alone is fine
  Status s = ValidateClusterConfig(c, 2);
  REQUIRE(!s.ok());
  REQUIRE(s.message().find("x.yaml:2") != std::string::npos);
  REQUIRE(s.message().find("persist.every_versions") != std::string::npos);
  REQUIRE(ParseConfig("persist:\n  dir: /p\n  every_versions: 5\n", "x.yaml", &c).ok());
  REQUIRE(ValidateClusterConfig(c, 2).ok());
}

TEST_CASE("cluster config: advice for a big job's heartbeats, none for a small one or a long interval", "[config]") {
  Config c = DefaultConfig();  // 200 ms x 10 misses
  CHECK(ClusterConfigAdvice(c, 64).empty());
  const std::string advice = ClusterConfigAdvice(c, 4096);
  CHECK_THAT(advice, Catch::Contains("cluster.heartbeat_interval 200ms at 4096 nodes"));
  CHECK_THAT(advice, Catch::Contains("up to 20480 heartbeats a second"));
  CHECK_THAT(advice, Catch::Contains("cluster.heartbeat_misses: 4 notices a lost node after 2000 ms (now 2000 ms)"));
  CHECK_THAT(advice, Catch::Contains("2.5x fewer"));
  c.cluster.heartbeat_interval = std::chrono::milliseconds(100);
  c.cluster.heartbeat_misses = 3;  // a 300 ms timeout: the advice keeps one miss at least
  CHECK_THAT(ClusterConfigAdvice(c, 2048), Catch::Contains("misses: 1 notices a lost node after 500 ms (now 300 ms)"));
  c.cluster.heartbeat_interval = std::chrono::milliseconds(500);
  CHECK(ClusterConfigAdvice(c, 4096).empty());
}

}  // namespace ftrun
