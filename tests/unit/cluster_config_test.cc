// The `cluster` section and the multi-node rules: bad values name the file,
// the line, the field and what was expected.
#include "plugin/config/config.h"
#include "tests/catch.h"
#include "tests/unit/config_test_util.h"
#include "tests/unit/temp_dir.h"

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

TEST_CASE("cluster.redundancy: erasure {data, parity} replaces the replicas", "[config]") {
  Config c;
  REQUIRE(ParseConfig("job: {id: a}\ncluster:\n  redundancy: {erasure: {data: 4, parity: 2}}\n", "x.yaml", &c).ok());
  CHECK(c.cluster.erasure.enabled());
  CHECK(c.cluster.erasure.data == 4);
  CHECK(c.cluster.erasure.parity == 2);
  CHECK(c.cluster.replicas == 0);
  CHECK(c.cluster.redundancy_loc.file == "x.yaml");
  CHECK(c.cluster.redundancy_loc.line == 3);
  REQUIRE(ParseConfig("cluster:\n  redundancy:\n    erasure:\n      data: 32\n      parity: 8\n", "x.yaml", &c).ok());
  CHECK(c.cluster.erasure.data == ErasureConfig::kMaxData);
  CHECK(c.cluster.erasure.parity == ErasureConfig::kMaxParity);
  CHECK(c.cluster.redundancy_loc.line == 2);
}

TEST_CASE("cluster.redundancy: {replicas: K} is cluster.replicas: K", "[config]") {
  Config c;
  REQUIRE(ParseConfig("cluster:\n  spares: 1\n  redundancy: {replicas: 2}\n", "x.yaml", &c).ok());
  CHECK(c.cluster.replicas == 2);
  CHECK_FALSE(c.cluster.erasure.enabled());
  CHECK(c.cluster.redundancy_loc.line == 3);
  REQUIRE(ParseConfig("cluster:\n  redundancy:\n    replicas: 0\n", "x.yaml", &c).ok());
  CHECK(c.cluster.replicas == 0);
  REQUIRE(ParseConfig("cluster:\n  replicas: 3\n", "x.yaml", &c).ok());
  CHECK(c.cluster.redundancy_loc.line == 2);  // plain replicas say where the redundancy came from too
}

TEST_CASE("cluster.redundancy: the default is one replica and no erasure", "[config]") {
  Config d = DefaultConfig();
  CHECK(d.cluster.replicas == 1);
  CHECK_FALSE(d.cluster.erasure.enabled());
  CHECK(d.cluster.erasure.data == 0);
  CHECK(d.cluster.erasure.parity == 0);
  CHECK(d.cluster.redundancy_loc.line == 0);
  Config c;
  REQUIRE(ParseConfig("cluster:\n  spares: 2\n", "x.yaml", &c).ok());
  CHECK(c.cluster.replicas == 1);
  CHECK_FALSE(c.cluster.erasure.enabled());
  CHECK(c.cluster.redundancy_loc.file == "x.yaml");
  CHECK(c.cluster.redundancy_loc.line == 0);
}

TEST_CASE("cluster.redundancy must be a map", "[config]") {
  const char* want = "expected a map: {erasure: {data: D, parity: P}} or {replicas: K}";
  ExpectError("cluster:\n  redundancy: erasure\n", 2, "cluster.redundancy", std::string(want) + ", got 'erasure'");
  ExpectError("cluster:\n  redundancy: [4, 2]\n", 2, "cluster.redundancy", std::string(want) + ", got a list");
  ExpectError("cluster:\n  redundancy:\n", 2, "cluster.redundancy", std::string(want) + ", got nothing");
}

TEST_CASE("cluster.redundancy takes one of erasure or replicas", "[config]") {
  ExpectError("cluster:\n  redundancy: {}\n", 2, "cluster.redundancy",
              "expected exactly one of erasure: {data: D, parity: P} or replicas: K, got neither");
  ExpectError("cluster:\n  spares: 0\n  redundancy:\n    erasure: {data: 4, parity: 2}\n    replicas: 1\n", 3,
              "cluster.redundancy", "expected exactly one of erasure: {data: D, parity: P} or replicas: K, got both");
}

TEST_CASE("cluster.redundancy: an unknown or repeated key names the known ones", "[config]") {
  ExpectError("cluster:\n  redundancy:\n    reed_solomon: {data: 4, parity: 2}\n", 3, "cluster.redundancy.reed_solomon",
              "unknown key (known: erasure, replicas)");
  ExpectError("cluster:\n  redundancy:\n    replicas: 1\n    replicas: 2\n", 4, "cluster.redundancy.replicas",
              "duplicate key");
}

TEST_CASE("cluster.redundancy.erasure must be a map", "[config]") {
  ExpectError("cluster:\n  redundancy:\n    erasure: 4+2\n", 3, "cluster.redundancy.erasure",
              "expected a map {data: D, parity: P}, got '4+2'");
  ExpectError("cluster:\n  redundancy:\n    erasure: [4, 2]\n", 3, "cluster.redundancy.erasure", "got a list");
}

TEST_CASE("cluster.redundancy.erasure needs data and parity", "[config]") {
  ExpectError("cluster:\n  redundancy:\n    erasure: {data: 4}\n", 3, "cluster.redundancy.erasure",
              "expected data and parity, like {data: 4, parity: 2}; parity is missing");
  ExpectError("cluster:\n  redundancy:\n    erasure:\n      parity: 2\n", 3, "cluster.redundancy.erasure",
              "data is missing");
}

TEST_CASE("cluster.redundancy.erasure: an unknown key names data and parity", "[config]") {
  ExpectError("cluster:\n  redundancy:\n    erasure:\n      data: 4\n      parity: 2\n      stripes: 3\n", 6,
              "cluster.redundancy.erasure.stripes", "unknown key (known: data, parity)");
}

TEST_CASE("cluster.redundancy.erasure.data: an integer from 1 to 32", "[config]") {
  for (const char* bad : {"0", "33", "-1", "four", "4.5"}) {
    ExpectError(std::string("cluster:\n  redundancy:\n    erasure:\n      data: ") + bad + "\n      parity: 2\n", 4,
                "cluster.redundancy.erasure.data",
                std::string("expected an integer from 1 to 32 (the data nodes of a group), got '") + bad + "'");
  }
  ExpectError("cluster:\n  redundancy: {erasure: {data: [4], parity: 2}}\n", 2, "cluster.redundancy.erasure.data",
              "got a list");
}

TEST_CASE("cluster.redundancy.erasure.parity: an integer from 1 to 8", "[config]") {
  for (const char* bad : {"0", "9", "two"}) {
    ExpectError(std::string("cluster:\n  redundancy:\n    erasure:\n      data: 4\n      parity: ") + bad + "\n", 5,
                "cluster.redundancy.erasure.parity",
                std::string("expected an integer from 1 to 8 (the parity nodes of a group: how many it can lose), "
                            "got '") +
                    bad + "'");
  }
}

TEST_CASE("cluster.replicas and cluster.redundancy in one file: an error naming both", "[config]") {
  ExpectError("cluster:\n  replicas: 2\n  spares: 1\n  redundancy: {erasure: {data: 4, parity: 2}}\n", 4,
              "cluster.redundancy",
              "set together with cluster.replicas (line 2); keep one (cluster.redundancy: {replicas: K} is "
              "cluster.replicas: K)");
  ExpectError("cluster:\n  redundancy: {replicas: 1}\n  replicas: 1\n", 3, "cluster.replicas",
              "set together with cluster.redundancy (line 2)");
}

TEST_CASE("cluster.redundancy.replicas: an integer >= 0", "[config]") {
  for (const char* bad : {"-1", "two", "1.5"}) {
    ExpectError(std::string("cluster:\n  redundancy:\n    replicas: ") + bad + "\n", 3, "cluster.redundancy.replicas",
                std::string("expected an integer >= 0, got '") + bad + "'");
  }
  ExpectError("cluster:\n  redundancy: {replicas: {k: 1}}\n", 2, "cluster.redundancy.replicas",
              "expected an integer >= 0, got a map");
}

TEST_CASE("cluster.redundancy: ValidateConfig re-checks an override and shows the value", "[config]") {
  Config c = DefaultConfig();
  c.cluster.erasure = ErasureConfig{40, 2};
  c.cluster.replicas = 0;
  CHECK(ValidateConfig(c).message() ==
        "<default>: cluster.redundancy: expected erasure data from 1 to 32 and parity from 1 to 8, got "
        "{erasure: {data: 40, parity: 2}}");
  c.cluster.erasure = ErasureConfig{4, 2};
  CHECK(ValidateConfig(c).ok());
  c.cluster.replicas = 1;
  CHECK(ValidateConfig(c).message() ==
        "<default>: cluster.redundancy: expected erasure with cluster.replicas 0 (the code replaces the copies), got "
        "{erasure: {data: 4, parity: 2}, replicas: 1}");
  c.cluster.erasure = ErasureConfig{0, 2};
  CHECK(ValidateConfig(c).message().find("got {erasure: {data: 0, parity: 2}") != std::string::npos);
}

TEST_CASE("cluster.redundancy: erasure needs the nodes in groups of data + parity", "[config]") {
  Config c;
  REQUIRE(ParseConfig("job: {id: a}\ncluster:\n  redundancy: {erasure: {data: 4, parity: 2}}\n", "x.yaml", &c).ok());
  CHECK(ValidateClusterConfig(c, 6).ok());
  CHECK(ValidateClusterConfig(c, 12).ok());
  CHECK(ValidateClusterConfig(c, 1).ok());  // one node: no peer, erasure ignored as replicas are
  Status s = ValidateClusterConfig(c, 8);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(s.message() ==
        "x.yaml:3: cluster.redundancy: an erasure code of 4 data + 2 parity needs the nodes in groups of 6; the job "
        "has 8 nodes (2 left over: use 6 or 12, or another code)");
  CHECK_THAT(ValidateClusterConfig(c, 4).message(), Catch::Contains("the job has 4 nodes (use 6, or another code)"));
  REQUIRE(ParseConfig("cluster:\n  redundancy: {erasure: {data: 2, parity: 1}}\n", "x.yaml", &c).ok());
  CHECK(ValidateClusterConfig(c, 3).ok());
  CHECK(ValidateClusterConfig(c, 9).ok());
  CHECK_THAT(ValidateClusterConfig(c, 4).message(), Catch::Contains("1 left over: use 3 or 6"));
}

TEST_CASE("cluster.redundancy: the budget holds parity/data of the node's state, not copies", "[config]") {
  Config c = DefaultConfig();
  c.cluster.replicas = 0;
  c.cluster.erasure = ErasureConfig{4, 2};
  c.store.memory_budget = 1ull << 30;
  c.store.snapshot_bytes = 512ull << 20;
  c.agent.ranks_per_node = 1;
  Status s = ValidateClusterConfig(c, 6);  // 2 x 1 x 1.5 x 512 MiB = 1.5 GiB > 1 GiB
  CHECK(s.message() ==
        "<default>: store.memory_budget: 1.0 GiB cannot hold this node's snapshots and its erasure parity 2/4 of "
        "them, each plus one in flight (2 x 1 ranks x (1 + erasure parity 2/4) x 512 MiB = 1.5 GiB); raise it or "
        "use less parity in cluster.redundancy");
  c.store.memory_budget = 1536ull << 20;  // exactly enough
  CHECK(ValidateClusterConfig(c, 6).ok());
  c.cluster.erasure = ErasureConfig{3, 1};  // 2 x 1 x 4/3 x 512 MiB = 1365.3 MiB, rounded up
  c.store.memory_budget = (2ull * 4 * (512ull << 20) + 2) / 3 - 1;
  CHECK_THAT(ValidateClusterConfig(c, 4).message(), Catch::Contains("erasure parity 1/3"));
  c.store.memory_budget += 1;
  CHECK(ValidateClusterConfig(c, 4).ok());
  c.store.memory_budget = 1;
  CHECK(ValidateClusterConfig(c, 1).ok());  // one node: nothing kept for others
  c.store.snapshot_bytes = UINT64_MAX / 2;  // 2 x ranks x bytes x (d + p) overflows: too big, not wrapped
  c.store.memory_budget = UINT64_MAX - 1;
  CHECK_FALSE(ValidateClusterConfig(c, 4).ok());
}

}  // namespace ftrun
