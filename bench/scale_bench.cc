// Scenario "scale": the coordinator against N simulated agents of 8 ranks
// (bench/scale_sim.h), one version saved per second. Measures the
// coordinator's CPU (its thread's, per second of wall time), commit latency
// (the last held report of a version -> every agent has its commit), the
// time to notice a silent node against the heartbeat timeout, and the time
// from noticing it to every agent having its recovery orders (the halt, and
// the start of the new epoch once a spare took the node).
#include <CLI/CLI.hpp>
#include <thread>

#include "bench/bench_util.h"
#include "bench/scale_sim.h"

namespace ftrun::bench {
namespace {

using std::chrono::milliseconds;

double Ms(SimClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// The agents' loop period: heartbeats are looked at this often.
constexpr milliseconds kAgentTick(20);

// Pumps the fleet until `done` says so or `limit` passes, with heartbeats.
template <class Done>
bool Drive(Fleet* fleet, milliseconds heartbeat, SimTime limit, Done done) {
  SimTime next_hb = SimClock::now();
  while (!done()) {
    const SimTime now = SimClock::now();
    if (now >= limit) return false;
    if (now >= next_hb) {
      fleet->Heartbeats(heartbeat);
      next_hb = now + kAgentTick;
    }
    fleet->Pump(std::min(next_hb, limit));
  }
  return true;
}

}  // namespace

int RunScale(int argc, char** argv, Result* r) {
  CLI::App app{"ftrun-bench scale: the coordinator against N simulated agents (in-process transport)"};
  int nodes = 256, ranks_per_node = 8, spares = 2, seconds = 20, heartbeat_ms = 200, misses = 10;
  int calibrate = 20000;
  uint64_t seed = 1;
  app.add_option("--nodes", nodes, "simulated nodes (agents started for a node)");
  app.add_option("--ranks-per-node", ranks_per_node, "ranks per node");
  app.add_option("--spares", spares, "spare agents");
  app.add_option("--seconds", seconds, "seconds of steady saving (one version per second)");
  app.add_option("--heartbeat-ms", heartbeat_ms, "cluster.heartbeat_interval");
  app.add_option("--misses", misses, "cluster.heartbeat_misses");
  app.add_option("--seed", seed, "the fleet's shuffles");
  app.add_option("--calibrate", calibrate, "messages timed over the real transport (UCX) for its estimate; 0: none");
  CLI11_PARSE(app, argc, argv);
  if (nodes < 2 || ranks_per_node < 1 || spares < 1 || seconds < 2 || heartbeat_ms < 1 || misses < 1 || calibrate < 0) {
    std::fprintf(stderr,
                 "ftrun-bench scale: needs --nodes >= 2, --spares >= 1, --seconds >= 2, --calibrate >= 0, "
                 "and positive --ranks-per-node, --heartbeat-ms, --misses\n");
    return 2;
  }
  // First, what a message costs over UCX here (nothing else runs yet).
  double per_message = 0;
  if (calibrate > 0) {
    UseTcpOnLoopback();
    std::string error;
    per_message = UcxCpuPerMessage(calibrate, &error);
    if (per_message < 0) {
      std::fprintf(stderr, "ftrun-bench scale: the UCX calibration failed: %s\n", error.c_str());
      return 1;
    }
  }
  const milliseconds heartbeat(heartbeat_ms);
  Coordinator::Options o;
  o.ranks_per_slot.assign(static_cast<size_t>(nodes), ranks_per_node);
  o.replicas = 1;
  o.heartbeat_interval = heartbeat;
  o.heartbeat_misses = misses;
  Mailbox to_coordinator, to_agents;
  Fleet fleet(nodes, spares, ranks_per_node, &to_agents, &to_coordinator, seed);
  CoordinatorThread coordinator(o, &to_coordinator, &to_agents);

  // The job forms: every agent registers; every node gets its start.
  const SimTime t_form = SimClock::now();
  fleet.RegisterAll();
  if (!Drive(&fleet, heartbeat, t_form + std::chrono::seconds(120), [&] { return !fleet.all_started.empty(); })) {
    std::fprintf(stderr, "ftrun-bench scale: the job did not form within 120 s\n");
    return 1;
  }
  const double form_s = Ms(SimClock::now() - t_form) / 1e3;

  // Steady state: a version a second, heartbeats, for `seconds`.
  const double cpu0 = coordinator.cpu_seconds();
  const uint64_t in0 = coordinator.messages_in(), out0 = coordinator.messages_out();
  const SimTime t_steady = SimClock::now();
  SimTime next_hb = t_steady, next_save = t_steady;
  uint64_t version = 1;
  for (SimTime now = t_steady; now < t_steady + std::chrono::seconds(seconds); now = SimClock::now()) {
    if (now >= next_hb) {
      fleet.Heartbeats(heartbeat);
      next_hb = now + kAgentTick;
    }
    if (now >= next_save) {
      fleet.Save(version++);
      next_save += std::chrono::seconds(1);
    }
    fleet.Pump(std::min(next_hb, next_save));
  }
  const double steady_s = Ms(SimClock::now() - t_steady) / 1e3;
  const double cpu = (coordinator.cpu_seconds() - cpu0) / steady_s;
  const double msgs_in = static_cast<double>(coordinator.messages_in() - in0) / steady_s;
  const double msgs_out = static_cast<double>(coordinator.messages_out() - out0) / steady_s;
  // The last versions' commits arrive (heartbeats go on meanwhile).
  const uint64_t last = version - 1;
  Drive(&fleet, heartbeat, SimClock::now() + std::chrono::seconds(30),
        [&] { return fleet.committed_at.count(last) > 0; });
  std::vector<double> lat;
  for (const auto& [v, at] : fleet.committed_at) {
    auto it = fleet.last_report.find(v);
    if (it != fleet.last_report.end()) lat.push_back(Ms(at - it->second));
  }
  const int uncommitted = static_cast<int>(last) - static_cast<int>(lat.size());

  // A node goes silent: noticed after the heartbeat timeout; every agent is
  // halted, a spare takes the node, every node gets the new epoch's start.
  const uint64_t epoch = fleet.all_started.rbegin()->first;
  const PeerId victim = fleet.Silence(nodes / 2);
  const milliseconds timeout = heartbeat * misses;
  const bool recovered = Drive(&fleet, heartbeat, SimClock::now() + timeout + std::chrono::seconds(60),
                               [&] { return fleet.all_started.rbegin()->first > epoch; });
  if (!recovered || fleet.first_halt.upper_bound(epoch) == fleet.first_halt.end()) {
    std::fprintf(stderr, "ftrun-bench scale: the silent node's recovery did not finish within 60 s of the timeout\n");
    return 1;
  }
  // Noticed: the first halt of the recovery (the epochs after `epoch`;
  // placing the spare may take a second one) against the victim's last
  // message plus the timeout. Orders: from then until every node's start.
  const auto noticed = fleet.first_halt.upper_bound(epoch);
  const double detect_over_timeout_ms =
      Ms(noticed->second - fleet.last_sent(victim)) - static_cast<double>(timeout.count());
  const auto halted = fleet.all_halted.find(noticed->first);
  const double halt_ms = halted == fleet.all_halted.end() ? -1 : Ms(halted->second - noticed->second);
  const double orders_ms = Ms(fleet.all_started.rbegin()->second - noticed->second);
  const uint64_t recovery_epochs = fleet.all_started.rbegin()->first - epoch;

  const double p50 = Percentile(lat, 0.5), p99 = Percentile(lat, 0.99);
  const bool big = nodes >= 4096;  // the targets are for 4,096 nodes x 8 ranks
  auto target = [&](const char* t) { return big ? std::string(t) : std::string(); };
  r->figures.push_back({"coordinator_cpu_cores", cpu, "cores", target("<= 0.5"), !big || cpu <= 0.5});
  if (calibrate > 0) {
    // The same traffic through UCX: each message in and out at the calibrated cost.
    const double ucx = cpu + (msgs_in + msgs_out) * per_message;
    r->figures.push_back({"ucx_cpu_per_message_us", per_message * 1e6, "us", "", true});
    r->figures.push_back(
        {"coordinator_cpu_cores_with_ucx", ucx, "cores (estimate)", target("<= 0.5"), !big || ucx <= 0.5});
  }
  r->figures.push_back({"commit_p50_ms", p50, "ms", "", true});
  r->figures.push_back({"commit_p99_ms", p99, "ms", target("<= 100"), !big || p99 <= 100});
  r->figures.push_back(
      {"silent_detect_over_timeout_ms", detect_over_timeout_ms, "ms", "<= 200", detect_over_timeout_ms <= 200});
  r->figures.push_back({"halt_delivered_ms", halt_ms, "ms", "", true});
  r->figures.push_back({"recovery_orders_ms", orders_ms, "ms", target("<= 500"), !big || orders_ms <= 500});
  r->figures.push_back({"versions_uncommitted", static_cast<double>(uncommitted), "", "0", uncommitted == 0});
  r->details = {
      {"nodes", nodes},
      {"ranks_per_node", ranks_per_node},
      {"spares", spares},
      {"versions", last},
      {"steady_s", steady_s},
      {"form_s", form_s},
      {"messages_in_per_s", msgs_in},
      {"messages_out_per_s", msgs_out},
      {"heartbeat_timeout_ms", timeout.count()},
      {"recovery_epochs", recovery_epochs},
      {"commit_latencies_ms", lat},
      {"transport", "in-process (two mailboxes); coordinator_cpu_cores_with_ucx adds the calibrated UCX cost"}};
  return 0;
}

}  // namespace ftrun::bench
