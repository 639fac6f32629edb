// JobMetrics and AgentMetrics from views, read back through prometheus-cpp's
// text format: counters follow running totals (and never go down), each
// recovery is observed once, redundancy and lost nodes are counted from the
// view. (Served over HTTP and linted by promtool: test_metrics.py.)
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <regex>
#include <string>

#include "launcher/agent/agent_metrics.h"
#include "launcher/runner/job_metrics.h"
#include "plugin/ipc/wire.h"
#include "tests/catch.h"

namespace ftrun {
namespace {

// The value of the sample `name{...labels containing `with`...}`; -1 when absent.
double Sample(prometheus::Registry& r, const std::string& name, const std::string& with = "") {
  const std::string text = prometheus::TextSerializer().Serialize(r.Collect());
  std::regex line("^" + name + "\\{([^}]*)\\} (\\S+)$", std::regex::multiline);
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it) {
    if ((*it)[1].str().find(with) != std::string::npos) return std::stod((*it)[2].str());
  }
  return -1;
}

}  // namespace

TEST_CASE("job metrics follow the coordinator's view", "[metrics]") {
  prometheus::Registry r;
  JobMetrics m(r, "j1");
  CoordinatorView v;
  v.phase = "running";
  v.replicas = 1;
  v.committed = 7;
  v.commits = 7;
  v.held_reports = 30;
  v.last_commit_lag_ms = 120;
  v.committed_copies = {2, 1, 2};  // rank 1 has lost its copy
  v.nodes = {{0, 2, "", 5u, "a"}, {1, 2, "", std::nullopt, ""}};
  m.Update(v);
  CHECK(Sample(r, "ftrun_job_committed_version", "job=\"j1\"") == 7);
  CHECK(Sample(r, "ftrun_job_commits_total") == 7);
  CHECK(Sample(r, "ftrun_job_held_reports_total") == 30);
  CHECK(Sample(r, "ftrun_job_ranks_below_redundancy") == 1);
  CHECK(Sample(r, "ftrun_job_nodes_lost") == 1);
  CHECK(Sample(r, "ftrun_job_running") == 1);
  CHECK(Sample(r, "ftrun_job_commit_lag_seconds_count") == 1);
  CHECK(Sample(r, "ftrun_job_last_commit_timestamp_seconds") > 1.7e9);
  // The same view again observes nothing new; a recovery is observed once it started, once.
  m.Update(v);
  CHECK(Sample(r, "ftrun_job_commit_lag_seconds_count") == 1);
  CoordinatorView::Recovery rec;
  rec.epoch = 1;
  rec.detected = CoordinatorView::Time{} + std::chrono::seconds(10);
  v.recoveries.push_back(rec);
  v.phase = "recovering";
  v.restarts = 1;
  m.Update(v);
  CHECK(Sample(r, "ftrun_job_recovery_start_seconds_count") == 0);  // not started yet
  CHECK(Sample(r, "ftrun_job_running") == 0);
  v.recoveries[0].started = rec.detected + std::chrono::milliseconds(250);
  m.Update(v);
  m.Update(v);
  CHECK(Sample(r, "ftrun_job_recovery_start_seconds_count") == 1);
  CHECK(Sample(r, "ftrun_job_recovery_start_seconds_sum") == Approx(0.25));
  CHECK(Sample(r, "ftrun_job_restarts_total") == 1);
  // A total that goes down (a new coordinator after --attach) never makes a counter go down.
  v.commits = 2;
  m.Update(v);
  v.commits = 4;
  m.Update(v);
  CHECK(Sample(r, "ftrun_job_commits_total") == 9);
}

TEST_CASE("agent metrics follow the agent's view; each recovery counted once, by kind, with its phases", "[metrics]") {
  prometheus::Registry r;
  AgentMetrics m(r, "j1", 3);
  AgentView v;
  v.committed = 4;
  v.store.used_bytes = 100;
  v.store.capacity_bytes = 1000;
  v.ranks = {{0, 11, false, true, false}, {1, 0, false, false, false}, {2, 12, true, false, false}};
  v.cluster = AgentView::Cluster{};
  v.cluster->transport.bulk_bytes_sent = 500;
  v.persist = nlohmann::json{{"backlog_versions", 2}, {"bytes_written", 4096}, {"chunks_scrub_failed", 1}};
  v.recoveries = nlohmann::json::array({{{"restart", 1}, {"kind", "warm"}}});  // not over yet
  m.Update(v);
  CHECK(Sample(r, "ftrun_committed_version", "node=\"3\"") == 4);
  CHECK(Sample(r, "ftrun_ranks_running") == 1);
  CHECK(Sample(r, "ftrun_store_used_bytes") == 100);
  CHECK(Sample(r, "ftrun_sent_bytes_total") == 500);
  CHECK(Sample(r, "ftrun_flush_backlog_versions") == 2);
  CHECK(Sample(r, "ftrun_flush_written_bytes_total") == 4096);
  CHECK(Sample(r, "ftrun_scrub_failed_chunks_total") == 1);
  CHECK(Sample(r, "ftrun_recoveries_total", "kind=\"warm\"") == 0);
  v.recoveries[0]["total_ms"] = 400.0;
  v.recoveries[0]["restore_ms"] = 50.0;
  m.Update(v);
  m.Update(v);
  CHECK(Sample(r, "ftrun_recoveries_total", "kind=\"warm\"") == 1);
  CHECK(Sample(r, "ftrun_recoveries_total", "kind=\"cold\"") == 0);
  CHECK(Sample(r, "ftrun_recovery_phase_seconds_count", "phase=\"total\"") == 1);
  CHECK(Sample(r, "ftrun_recovery_phase_seconds_sum", "phase=\"restore\"") == Approx(0.05));
  v.recoveries.push_back({{"restart", 2}, {"kind", "cold"}, {"total_ms", 3000.0}});
  v.cluster->transport.bulk_bytes_sent = 800;
  m.Update(v);
  CHECK(Sample(r, "ftrun_recoveries_total", "kind=\"cold\"") == 1);
  CHECK(Sample(r, "ftrun_recovery_phase_seconds_count", "phase=\"total\"") == 2);
  CHECK(Sample(r, "ftrun_sent_bytes_total") == 800);
}

TEST_CASE("save stalls: reports land in their buckets; the metrics get each save once", "[metrics]") {
  SaveStalls st;
  const auto& b = SaveStalls::Bounds();
  REQUIRE(std::is_sorted(b.begin(), b.end()));
  REQUIRE(st.Report(EncodeSaveStall(7, 0.0004)).ok());  // below the first bound
  REQUIRE(st.Report(EncodeSaveStall(8, 0.003)).ok());   // (0.0025, 0.005]
  st.Add(b.back() * 3);                                 // past the last bound: +Inf
  CHECK(st.buckets()[0] == 1);
  CHECK(st.buckets()[3] == 1);
  CHECK(st.buckets().back() == 1);
  CHECK(st.count() == 3);
  CHECK(st.sum_seconds() == Approx(0.0004 + 0.003 + b.back() * 3));
  CHECK(st.max_seconds() == Approx(b.back() * 3));
  // A malformed report counts nothing and says what a report is.
  for (const std::string& bad : {std::string(15, 'x'), std::string(17, 'x'), std::string()}) {
    Status s = st.Report(bad);
    REQUIRE(!s.ok());
    CHECK(s.message().find("16 bytes (version, nanoseconds)") != std::string::npos);
  }
  CHECK(st.count() == 3);

  prometheus::Registry r;
  AgentMetrics m(r, "j1", 0);
  AgentView v;
  v.save_stalls = &st;
  m.Update(v);
  m.Update(v);  // nothing new: nothing observed twice
  CHECK(Sample(r, "ftrun_save_stall_seconds_count") == 3);
  CHECK(Sample(r, "ftrun_save_stall_seconds_bucket", "le=\"0.0005") == 1);
  CHECK(Sample(r, "ftrun_save_stall_seconds_bucket", "le=\"0.005") == 2);
  st.Add(0.02);
  m.Update(v);
  CHECK(Sample(r, "ftrun_save_stall_seconds_count") == 4);
  CHECK(Sample(r, "ftrun_save_stall_seconds_sum") == Approx(st.sum_seconds()));
}

}  // namespace ftrun
