#include "plugin/config/config.h"

#include <ftw.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <string>

#include "tests/catch.h"
#include "tests/unit/config_test_util.h"
#include "tests/unit/temp_dir.h"

namespace ftrun {
namespace {

using std::chrono::milliseconds;

// The repository root, from this file's path (CMake compiles it by absolute path).
std::string RepoRoot() {
#ifdef FTRUN_SOURCE_DIR
  return FTRUN_SOURCE_DIR;
#else
  std::string f = __FILE__;
  const std::string tail = "tests/unit/config_test.cc";
  return f.size() >= tail.size() ? f.substr(0, f.size() - tail.size()) : "./";
#endif
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_CASE("DefaultConfig has the documented defaults", "[config]") {
  Config c = DefaultConfig();
  CHECK(c.source == "<default>");
  CHECK(c.job.id.empty());
  CHECK(c.job.max_restarts == 3);
  CHECK(c.job.hang_timeout == milliseconds(60000));
  CHECK(c.job.stop_grace == milliseconds(5000));
  CHECK(c.store.memory_budget == (4ull << 30));
  CHECK(c.store.chunk_size == (4ull << 20));
  CHECK(c.store.snapshot_bytes == 0);
  CHECK(c.store.prefault);
  CHECK(c.store.memory_budget_loc.line == 0);
  CHECK(c.agent.run_dir == DefaultRunDir());  // per user: default_run_dir.h
  CHECK(c.agent.log_level == "info");
  CHECK(c.agent.ranks_per_node == 1);
  CHECK(c.persist.dir.empty());
  CHECK(c.persist.every_versions == 0);
  CHECK(c.persist.every_seconds == milliseconds(300000));
  CHECK(c.persist.keep == 2);
  CHECK(c.persist.rate_limit == 0);
  CHECK(c.persist.direct_io);
  CHECK(c.persist.drain_timeout == milliseconds(60000));
  CHECK(ValidateConfig(c).ok());
}

TEST_CASE("FormatLoc", "[config]") {
  CHECK(FormatLoc({"configs/x.yaml", 12, 3}, "store.memory_budget") == "configs/x.yaml:12: store.memory_budget");
  CHECK(FormatLoc({"configs/x.yaml", 0, 0}, "store.memory_budget") == "configs/x.yaml: store.memory_budget");
  CHECK(FormatLoc(SourceLoc{}, "store.memory_budget") == "<default>: store.memory_budget");
  CHECK(FormatLoc({"x.yaml", 4, 1}, "") == "x.yaml:4");
}

TEST_CASE("configs/default.yaml matches DefaultConfig", "[config]") {
  Config c;
  std::string path = RepoRoot() + "configs/default.yaml";
  Status st = LoadConfigFile(path, &c);
  INFO(st.ToString());
  REQUIRE(st.ok());
  Config d = DefaultConfig();
  CHECK(c.source == path);
  CHECK(c.job.id == d.job.id);
  CHECK(c.job.max_restarts == d.job.max_restarts);
  CHECK(c.job.hang_timeout == d.job.hang_timeout);
  CHECK(c.job.stop_grace == d.job.stop_grace);
  CHECK(c.store.memory_budget == d.store.memory_budget);
  CHECK(c.store.chunk_size == d.store.chunk_size);
  CHECK(c.store.snapshot_bytes == d.store.snapshot_bytes);
  CHECK(c.store.prefault == d.store.prefault);
  CHECK(c.agent.run_dir == d.agent.run_dir);
  CHECK(c.agent.log_level == d.agent.log_level);
  CHECK(c.agent.ranks_per_node == d.agent.ranks_per_node);
  CHECK(c.persist.dir == d.persist.dir);
  CHECK(c.persist.every_versions == d.persist.every_versions);
  CHECK(c.persist.every_seconds == d.persist.every_seconds);
  CHECK(c.persist.keep == d.persist.keep);
  CHECK(c.persist.rate_limit == d.persist.rate_limit);
  CHECK(c.persist.direct_io == d.persist.direct_io);
  CHECK(c.persist.drain_timeout == d.persist.drain_timeout);
  CHECK(c.persist.file_mode == d.persist.file_mode);
  CHECK(c.metrics.agent_listen == d.metrics.agent_listen);
  CHECK(c.metrics.coordinator_listen == d.metrics.coordinator_listen);
  CHECK(c.coordinator.etcd_endpoints == d.coordinator.etcd_endpoints);
  CHECK(c.coordinator.etcd_prefix == d.coordinator.etcd_prefix);
  CHECK(c.coordinator.etcd_lease_ttl == d.coordinator.etcd_lease_ttl);
  CHECK(c.cluster.replicas == d.cluster.replicas);
  CHECK(c.job.output_prefix == d.job.output_prefix);
  CHECK(c.cluster.erasure.data == d.cluster.erasure.data);
  CHECK(c.cluster.erasure.parity == d.cluster.erasure.parity);
  CHECK(c.store.memory_budget_loc.file == path);
  CHECK(c.store.memory_budget_loc.line == 12);
  CHECK(c.store.memory_budget_loc.column == 3);
}

TEST_CASE("example configs parse", "[config]") {
  Config small;
  REQUIRE(LoadConfigFile(RepoRoot() + "configs/examples/small.yaml", &small).ok());
  CHECK(small.store.memory_budget == (256ull << 20));
  CHECK(small.store.chunk_size == (1ull << 20));
  CHECK(small.job.hang_timeout == milliseconds(10000));
  CHECK(small.job.max_restarts == 3);  // not in the file: default

  Config large;
  REQUIRE(LoadConfigFile(RepoRoot() + "configs/examples/large-state.yaml", &large).ok());
  CHECK(large.store.memory_budget == (16ull << 30));
  CHECK(large.store.snapshot_bytes == (2ull << 30));
  CHECK(large.agent.ranks_per_node == 4);
  CHECK(large.store.chunk_size == (4ull << 20));
}

TEST_CASE("every key is read", "[config]") {
  const char* text =
      "job:\n"
      "  id: run-7.a_b\n"
      "  max_restarts: 0\n"
      "  hang_timeout: 1.5s\n"
      "  stop_grace: 0s\n"
      "store:\n"
      "  memory_budget: 1GiB\n"
      "  chunk_size: 64KiB\n"
      "  snapshot_bytes: 100MB\n"
      "  prefault: no\n"
      "agent:\n"
      "  run_dir: /var/run/ftrun\n"
      "  log_level: debug\n"
      "  ranks_per_node: 2\n";
  Config c;
  Status st = ParseConfig(text, "inline.yaml", &c);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(c.source == "inline.yaml");
  CHECK(c.job.id == "run-7.a_b");
  CHECK(c.job.max_restarts == 0);
  CHECK(c.job.hang_timeout == milliseconds(1500));
  CHECK(c.job.stop_grace == milliseconds(0));
  CHECK(c.store.memory_budget == (1ull << 30));
  CHECK(c.store.chunk_size == (64ull << 10));
  CHECK(c.store.snapshot_bytes == 100000000ull);
  CHECK_FALSE(c.store.prefault);
  CHECK(c.agent.run_dir == "/var/run/ftrun");
  CHECK(c.agent.log_level == "debug");
  CHECK(c.agent.ranks_per_node == 2);
  CHECK(c.store.memory_budget_loc.line == 7);
}

TEST_CASE("restart: warm standbys and the abort timeout", "[config]") {
  Config c;
  REQUIRE(ParseConfig("", "d.yaml", &c).ok());
  CHECK(c.restart.warm_standbys == RestartConfig::kAuto);
  CHECK(c.restart.abort_timeout == milliseconds(5000));
  REQUIRE(ParseConfig("restart:\n  warm_standbys: 2\n  abort_timeout: 750ms\n", "r.yaml", &c).ok());
  CHECK(c.restart.warm_standbys == 2);
  CHECK(c.restart.abort_timeout == milliseconds(750));
  REQUIRE(ParseConfig("restart:\n  warm_standbys: auto\n", "r.yaml", &c).ok());
  CHECK(c.restart.warm_standbys == RestartConfig::kAuto);
  REQUIRE(ParseConfig("restart:\n  warm_standbys: 0\n", "r.yaml", &c).ok());
  CHECK(c.restart.warm_standbys == 0);
  ExpectError("restart:\n  warm_standbys: -1\n", 2, "restart.warm_standbys",
              "expected auto or an integer >= 0, got '-1'");
  ExpectError("restart:\n  warm_standbys: some\n", 2, "restart.warm_standbys", "got 'some'");
  ExpectError("restart:\n  abort_timeout: 0s\n", 2, "restart.abort_timeout", "> 0");
  ExpectError("restart:\n  warm: 1\n", 2, "restart.warm", "known: warm_standbys, abort_timeout");
}

TEST_CASE("empty documents and empty sections give defaults", "[config]") {
  for (const char* text : {"", "# nothing\n", "job:\nstore:\n", "{}\n"}) {
    Config c;
    Status st = ParseConfig(text, "e.yaml", &c);
    INFO("'" << text << "': " << st.ToString());
    REQUIRE(st.ok());
    CHECK(c.source == "e.yaml");
    CHECK(c.store.memory_budget == (4ull << 30));
    CHECK(c.agent.ranks_per_node == 1);
  }
}

TEST_CASE("unknown keys are errors", "[config]") {
  ExpectError("# comment\njob:\n  max_restart: 3\n", 3, "job.max_restart",
              "unknown key (known: id, max_restarts, hang_timeout, stop_grace, output_prefix)");
  ExpectError("store:\n  chunk_size: 1MiB\n  budget: 1GiB\n", 3, "store.budget",
              "unknown key (known: memory_budget, chunk_size, snapshot_bytes, prefault)");
  ExpectError("job: {}\nstorage:\n  x: 1\n", 2, "storage",
              "unknown key (known: job, store, agent, cluster, persist, restart, metrics, coordinator)");
  ExpectError("persist:\n  dir: /d\n  every: 10\n", 3, "persist.every",
              "unknown key (known: dir, every_versions, every_seconds, keep, rate_limit, direct_io, file_mode, "
              "drain_timeout)");
  ExpectError("agent:\n  log_level: info\n  log_level: warn\n", 3, "agent.log_level", "duplicate key");
}

TEST_CASE("wrong node types are errors", "[config]") {
  ExpectError("store:\n  memory_budget:\n    value: 4GiB\n", 2, "store.memory_budget",
              "expected a size like 4GiB or 512MiB, got a map");
  ExpectError("agent:\n  ranks_per_node: [1, 2]\n", 2, "agent.ranks_per_node", "expected an integer >= 1, got a list");
  ExpectError("job:\n  max_restarts:\n", 2, "job.max_restarts", "got nothing");
  ExpectError("job: fast\n", 1, "job", "expected a map of job settings");
  ExpectError("store:\n  - memory_budget: 4GiB\n", 1, "store", "got a list");
}

TEST_CASE("bad values name the field and quote the text", "[config]") {
  ExpectError("job:\n  id: x\n\nagent:\n  run_dir: /tmp\nstore:\n  memory_budget: 4 gigs\n", 7, "store.memory_budget",
              "expected a size like 4GiB or 512MiB, got '4 gigs'");
  ExpectError("agent: {}\n\n\njob:\n  max_restarts: three\n", 5, "job.max_restarts",
              "expected an integer >= 0, got 'three'");
  ExpectError("job:\n  max_restarts: -1\n", 2, "job.max_restarts", "expected an integer >= 0, got '-1'");
  ExpectError("job:\n  max_restarts: 99999999999\n", 2, "job.max_restarts", "expected an integer >= 0");
  ExpectError("agent:\n  ranks_per_node: 0\n", 2, "agent.ranks_per_node", "expected an integer >= 1, got '0'");
  ExpectError("job:\n  hang_timeout: 10\n", 2, "job.hang_timeout",
              "expected a duration like 30s, 500ms, 2m or 1h, got '10'");
  ExpectError("job:\n  stop_grace: 5 sec\n", 2, "job.stop_grace", "got '5 sec'");
  ExpectError("job:\n  hang_timeout: 0s\n", 2, "job.hang_timeout", "expected a duration > 0");
  ExpectError("store:\n  prefault: maybe\n", 2, "store.prefault", "expected true or false, got 'maybe'");
  ExpectError("agent:\n  log_level: verbose\n", 2, "agent.log_level",
              "expected one of trace, debug, info, warn, error, got 'verbose'");
  ExpectError("agent:\n  run_dir: ''\n", 2, "agent.run_dir", "expected a directory path");
  ExpectError("job:\n  id: ../etc\n", 2, "job.id", "got '../etc'");
}

TEST_CASE("chunk_size must be a power of two from 64KiB to 1GiB", "[config]") {
  for (const char* bad : {"3MiB", "32KiB", "2GiB", "0", "4MB"}) {
    ExpectError(std::string("store:\n  chunk_size: ") + bad + "\n", 2, "store.chunk_size",
                std::string("expected a power of two from 64KiB to 1GiB, like 4MiB, got '") + bad + "'");
  }
  Config c;
  CHECK(ParseConfig("store:\n  chunk_size: 1GiB\n  memory_budget: 2GiB\n", "ok.yaml", &c).ok());
}

TEST_CASE("the budget must hold two snapshots of every rank", "[config]") {
  ExpectError("agent:\n  ranks_per_node: 2\nstore:\n  snapshot_bytes: 512MiB\n  memory_budget: 1GiB\n", 5,
              "store.memory_budget",
              "1.0 GiB cannot hold one snapshot of every rank plus one in flight "
              "(2 x 2 ranks x 512 MiB = 2.0 GiB); raise it or lower store.snapshot_bytes");

  // Exactly enough is fine.
  Config c;
  CHECK(ParseConfig("agent: {ranks_per_node: 2}\nstore: {snapshot_bytes: 512MiB, memory_budget: 2GiB}\n", "ok.yaml", &c)
            .ok());

  // A defaulted budget has no line; the message still names the file.
  Status st = ParseConfig("store:\n  snapshot_bytes: 3GiB\n", "d.yaml", &c);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message().rfind("d.yaml: store.memory_budget: 4.0 GiB cannot hold", 0) == 0);
  CHECK(Contains(st.message(), "(2 x 1 rank x 3.0 GiB = 6.0 GiB)"));
}

TEST_CASE("the budget must hold one chunk", "[config]") {
  ExpectError("store:\n  chunk_size: 64MiB\n  memory_budget: 16MiB\n", 3, "store.memory_budget",
              "16.0 MiB is smaller than one chunk (store.chunk_size = 64.0 MiB)");
}

TEST_CASE("ValidateConfig re-checks after a command-line override", "[config]") {
  Config c;
  std::string path = RepoRoot() + "configs/examples/large-state.yaml";
  REQUIRE(LoadConfigFile(path, &c).ok());
  CHECK(ValidateConfig(c).ok());
  c.agent.ranks_per_node = 8;  // as if --ranks-per-node 8
  Status st = ValidateConfig(c);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message() == path +
                            ":4: store.memory_budget: 16.0 GiB cannot hold one snapshot of every rank "
                            "plus one in flight (2 x 8 ranks x 2.0 GiB = 32.0 GiB); raise it or "
                            "lower store.snapshot_bytes");

  Config d = DefaultConfig();
  d.agent.ranks_per_node = 0;
  st = ValidateConfig(d);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message() == "<default>: agent.ranks_per_node: expected an integer >= 1, got 0");

  d = DefaultConfig();
  d.store.snapshot_bytes = UINT64_MAX / 2;  // 2 x ranks x bytes overflows
  CHECK(ValidateConfig(d).code() == Code::kInvalidArgument);
}

TEST_CASE("YAML syntax errors give line and column", "[config]") {
  TempDir dir;
  std::string path = dir.Write("syntax.yaml", "job:\n  id: a\nstore:\n  chunk_size: [1MiB\n");
  Config c;
  Status st = LoadConfigFile(path, &c);
  INFO(st.ToString());
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message().rfind(path + ":", 0) == 0);
  CHECK(Contains(st.message(), ": YAML syntax error: "));

  st = ParseConfig("job:\n  id: a\nstore: {a: [1, 2}\n", "s.yaml", &c);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message() == "s.yaml:3:17: YAML syntax error: illegal flow end");

  st = ParseConfig("job: {}\n---\nstore: {}\n", "m.yaml", &c);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(Contains(st.message(), "expected one YAML document"));
}

TEST_CASE("unreadable files are IoError naming the path", "[config]") {
  TempDir dir;
  std::string missing = dir.path() + "/nope.yaml";
  Config c;
  Status st = LoadConfigFile(missing, &c);
  CHECK(st.code() == Code::kIoError);
  CHECK(Contains(st.message(), missing));
  CHECK(Contains(st.message(), "No such file or directory"));

  st = LoadConfigFile(dir.path(), &c);  // a directory
  CHECK(st.code() == Code::kIoError);
  CHECK(Contains(st.message(), dir.path()));
}

TEST_CASE("persist keys are read", "[config]") {
  Config c;
  Status st = ParseConfig(
      "persist:\n"
      "  dir: /var/ftrun/persist\n"
      "  every_versions: 10\n"
      "  every_seconds: 2m\n"
      "  keep: 3\n"
      "  rate_limit: 500MiB\n"
      "  direct_io: off\n"
      "  drain_timeout: 0s\n",
      "p.yaml", &c);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(c.persist.dir == "/var/ftrun/persist");
  CHECK(c.persist.every_versions == 10);
  CHECK(c.persist.every_seconds == milliseconds(120000));
  CHECK(c.persist.keep == 3);
  CHECK(c.persist.rate_limit == (500ull << 20));
  CHECK_FALSE(c.persist.direct_io);
  CHECK(c.persist.drain_timeout == milliseconds(0));
  CHECK(c.persist.dir_loc.line == 2);
  // Only one trigger is needed.
  CHECK(ParseConfig("persist: {dir: /p, every_seconds: 0s, every_versions: 1}\n", "a.yaml", &c).ok());
  CHECK(ParseConfig("persist: {dir: /p}\n", "b.yaml", &c).ok());            // every_seconds defaults to 300s
  CHECK(ParseConfig("persist: {every_seconds: 0s}\n", "c.yaml", &c).ok());  // no dir: off
}

TEST_CASE("bad persist values name the field", "[config]") {
  ExpectError("persist:\n  keep: 0\n", 2, "persist.keep", "expected an integer >= 1, got '0'");
  ExpectError("persist:\n  every_versions: -1\n", 2, "persist.every_versions", "expected an integer >= 0, got '-1'");
  ExpectError("persist:\n  every_seconds: 300\n", 2, "persist.every_seconds",
              "expected a duration like 30s, 500ms, 2m or 1h, got '300'");
  ExpectError("persist:\n  rate_limit: 10KiB\n", 2, "persist.rate_limit",
              "expected 0 (unlimited) or at least 1MiB per second, like 500MiB, got '10KiB'");
  ExpectError("persist:\n  rate_limit: fast\n", 2, "persist.rate_limit", "got 'fast'");
  ExpectError("persist:\n  direct_io: maybe\n", 2, "persist.direct_io", "expected true or false, got 'maybe'");
  ExpectError("persist:\n  dir: [a, b]\n", 2, "persist.dir", "got a list");
  ExpectError("persist:\n  drain_timeout: soon\n", 2, "persist.drain_timeout",
              "expected a duration like 30s, 500ms, 2m or 1h, got 'soon'");
  ExpectError("persist: /data\n", 1, "persist", "expected a map of persist settings");
}

TEST_CASE("a persist dir needs something to trigger a write", "[config]") {
  ExpectError("job: {id: x}\npersist:\n  every_seconds: 0s\n  dir: /data/ckpt\n", 4, "persist.dir",
              "'/data/ckpt' is set but nothing triggers a write: persist.every_versions is 0 and "
              "persist.every_seconds is 0s; set one of them above 0");
  Config c = DefaultConfig();
  c.persist.dir = "/d";  // as if set from the command line
  c.persist.every_seconds = milliseconds(0);
  Status st = ValidateConfig(c);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message().rfind("<default>: persist.dir: '/d' is set but nothing triggers a write", 0) == 0);
  c = DefaultConfig();
  c.persist.keep = 0;
  CHECK(ValidateConfig(c).message() == "<default>: persist.keep: expected an integer >= 1, got 0");
}

TEST_CASE("metrics listen addresses: HOST:PORT or empty, else an error naming the field", "[config]") {
  Config c;
  REQUIRE(ParseConfig("metrics:\n  agent_listen: 0.0.0.0:9401\n  coordinator_listen: ''\n", "m.yaml", &c).ok());
  CHECK(c.metrics.agent_listen == "0.0.0.0:9401");
  CHECK(c.metrics.coordinator_listen.empty());
  CHECK(DefaultConfig().metrics.agent_listen.empty());
  CHECK(DefaultConfig().metrics.coordinator_listen == "127.0.0.1:0");
  const char* want = "HOST:PORT (port 0 to 65535; 0: any free port) or empty (off)";
  for (const char* bad : {"9401", ":9401", "host:", "host:99999", "host:12ab", "host:1234567", "a b:1"}) {
    ExpectError(std::string("metrics:\n  agent_listen: '") + bad + "'\n", 2, "metrics.agent_listen", want);
  }
  ExpectError("metrics:\n  coordinator_listen: localhost\n", 2, "metrics.coordinator_listen", want);
}

TEST_CASE("coordinator.etcd_*: endpoints, prefix, lease, TLS files; each bad value named", "[config]") {
  Config c;
  REQUIRE(ParseConfig("coordinator:\n  etcd_endpoints: http://10.0.0.1:2379, https://etcd-b:2379\n"
                      "  etcd_prefix: /jobs\n  etcd_lease_ttl: 10s\n  etcd_ca_file: /ca.pem\n",
                      "e.yaml", &c)
              .ok());
  CHECK(c.coordinator.etcd_endpoints == std::vector<std::string>{"http://10.0.0.1:2379", "https://etcd-b:2379"});
  CHECK(c.coordinator.etcd_prefix == "/jobs");
  CHECK(c.coordinator.etcd_lease_ttl == milliseconds(10000));
  CHECK(c.coordinator.etcd_ca_file == "/ca.pem");
  CHECK(DefaultConfig().coordinator.etcd_endpoints.empty());  // off unless asked for
  const char* urls = "expected http://HOST:PORT or https://HOST:PORT URLs separated by commas";
  for (const char* bad : {"10.0.0.1:2379", "http://", "ftp://a:1", "http://a:1/v3", "http://a:1,,http://b:1"}) {
    ExpectError(std::string("coordinator:\n  etcd_endpoints: '") + bad + "'\n", 2, "coordinator.etcd_endpoints", urls);
  }
  for (const char* bad : {"jobs", "/", "/jobs/"}) {
    ExpectError(std::string("coordinator:\n  etcd_prefix: '") + bad + "'\n", 2, "coordinator.etcd_prefix",
                "a key prefix like /ftrun");
  }
  for (const char* bad : {"1s", "1500ms", "301s"}) {
    ExpectError(std::string("coordinator:\n  etcd_lease_ttl: ") + bad + "\n", 2, "coordinator.etcd_lease_ttl",
                "whole seconds from 2s to 300s");
  }
  Status st = ParseConfig("coordinator:\n  etcd_cert_file: /c.pem\n", "t.yaml", &c);
  CHECK(st.message() ==
        "t.yaml: coordinator.etcd_key_file: expected coordinator.etcd_cert_file and coordinator.etcd_key_file "
        "together (a client certificate and its key), got only one");
}

TEST_CASE("cluster.copy_timeout is read and must be above 0", "[config]") {
  CHECK(DefaultConfig().cluster.copy_timeout == milliseconds(5000));
  Config c;
  REQUIRE(ParseConfig("cluster:\n  copy_timeout: 1500ms\n", "inline.yaml", &c).ok());
  CHECK(c.cluster.copy_timeout == milliseconds(1500));
  Config d;
  REQUIRE(LoadConfigFile(RepoRoot() + "configs/default.yaml", &d).ok());
  CHECK(d.cluster.copy_timeout == DefaultConfig().cluster.copy_timeout);
  ExpectError("cluster:\n  copy_timeout: 0s\n", 2, "cluster.copy_timeout", "a duration > 0 like 5s");
  ExpectError("cluster:\n  copy_timeout: soon\n", 2, "cluster.copy_timeout",
              "expected a duration like 30s, 500ms, 2m or 1h, got 'soon'");
}

}  // namespace
}  // namespace ftrun
