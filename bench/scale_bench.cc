// Scenario "scale": the coordinator against N simulated agents of 8 ranks
// (bench/scale_sim.h), one version saved per second. Measures the
// coordinator's CPU (its thread's, or with --transport ucx its whole
// process's, per second of wall time), commit latency (the last held report
// of a version -> every agent has its commit), the time to notice a silent
// node against the heartbeat timeout, and the time from noticing it to every
// agent having its recovery orders (the halt, and the start of the new epoch
// once a spare took the node).
//
// In-process runs are calibrated against UCX where both run: the same fleet
// at --calibrate-nodes over UCX (scale_ucx.h) and in-process; the
// difference in the coordinator's CPU per message in or out is what UCX
// adds, and coordinator_cpu_cores_with_ucx adds that to the in-process run.
#include <CLI/CLI.hpp>
#include <thread>

#include "bench/bench_util.h"
#include "bench/scale_sim.h"
#include "bench/scale_ucx.h"

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

struct ScaleParams {
  int nodes = 256, ranks_per_node = 8, spares = 2, seconds = 20;
  milliseconds heartbeat{200};
  int misses = 10;
  uint64_t seed = 1;
  bool over_ucx = false;
  bool failures = true;  // after the steady phase, one node goes silent, then another dies; spares take them
};

struct ScaleRun {
  double cpu = 0, msgs_in = 0, msgs_out = 0, form_s = 0, steady_s = 0;
  uint64_t versions = 0;
  std::vector<double> latencies;  // ms, per committed version
  int uncommitted = 0;
  double detect_over_timeout_ms = 0, halt_ms = 0, orders_ms = 0;  // the silent node, from its notice
  double dead_noticed_ms = 0, dead_orders_ms = 0;                 // the dead node, from its death
  uint64_t recovery_epochs = 0;
};

Status Measure(const ScaleParams& p, ScaleRun* out) {
  Coordinator::Options o;
  o.ranks_per_slot.assign(static_cast<size_t>(p.nodes), p.ranks_per_node);
  o.replicas = 1;
  o.heartbeat_interval = p.heartbeat;
  o.heartbeat_misses = p.misses;
  // The coordinator's process is forked before this one has UCX state.
  std::string secret;
  UcxCoordinatorProcess coordinator_process;
  if (p.over_ucx) {
    FTRUN_RETURN_IF_ERROR(NewBenchSecret(&secret));
    FTRUN_RETURN_IF_ERROR(coordinator_process.Start(o, secret));
  }
  Mailbox to_coordinator, to_agents;
  Fleet fleet(p.nodes, p.spares, p.ranks_per_node, &to_agents, &to_coordinator, p.seed);
  std::unique_ptr<CoordinatorThread> coordinator_thread;
  UcxFleetLink link(&to_coordinator, &to_agents);
  if (p.over_ucx) {
    FTRUN_RETURN_IF_ERROR(link.Start(fleet.agents(), secret, coordinator_process.address()));
  } else {
    coordinator_thread = std::make_unique<CoordinatorThread>(o, &to_coordinator, &to_agents);
  }
  auto sample = [&](CoordinatorSample* c) {
    if (p.over_ucx) return coordinator_process.Sample(c);
    *c = {coordinator_thread->cpu_seconds(), coordinator_thread->messages_in(), coordinator_thread->messages_out()};
    return Status::Ok();
  };

  // The job forms: every agent registers; every node gets its start.
  const SimTime t_form = SimClock::now();
  fleet.RegisterAll();
  if (!Drive(&fleet, p.heartbeat, t_form + std::chrono::seconds(120), [&] { return !fleet.all_started.empty(); }))
    return Status::Timeout("the job did not form within 120 s");
  out->form_s = Ms(SimClock::now() - t_form) / 1e3;

  // Steady state: a version a second, heartbeats, for `seconds`.
  CoordinatorSample c0, c1;
  FTRUN_RETURN_IF_ERROR(sample(&c0));
  const SimTime t_steady = SimClock::now();
  SimTime next_hb = t_steady, next_save = t_steady;
  uint64_t version = 1;
  for (SimTime now = t_steady; now < t_steady + std::chrono::seconds(p.seconds); now = SimClock::now()) {
    if (now >= next_hb) {
      fleet.Heartbeats(p.heartbeat);
      next_hb = now + kAgentTick;
    }
    if (now >= next_save) {
      fleet.Save(version++);
      next_save += std::chrono::seconds(1);
    }
    fleet.Pump(std::min(next_hb, next_save));
  }
  FTRUN_RETURN_IF_ERROR(sample(&c1));
  out->steady_s = Ms(SimClock::now() - t_steady) / 1e3;
  out->cpu = (c1.cpu_seconds - c0.cpu_seconds) / out->steady_s;
  out->msgs_in = static_cast<double>(c1.messages_in - c0.messages_in) / out->steady_s;
  out->msgs_out = static_cast<double>(c1.messages_out - c0.messages_out) / out->steady_s;
  // The last versions' commits arrive (heartbeats go on meanwhile).
  out->versions = version - 1;
  Drive(&fleet, p.heartbeat, SimClock::now() + std::chrono::seconds(30),
        [&] { return fleet.committed_at.count(out->versions) > 0; });
  for (const auto& [v, at] : fleet.committed_at) {
    auto it = fleet.last_report.find(v);
    if (it != fleet.last_report.end()) out->latencies.push_back(Ms(at - it->second));
  }
  out->uncommitted = static_cast<int>(out->versions) - static_cast<int>(out->latencies.size());
  if (!p.failures) {
    coordinator_process.Stop();  // before the agents' transports close (it would log their losses)
    return Status::Ok();
  }

  // A node goes silent: noticed after the heartbeat timeout; every agent is
  // halted, a spare takes the node, every node gets the new epoch's start.
  const uint64_t epoch = fleet.all_started.rbegin()->first;
  const PeerId victim = fleet.Silence(p.nodes / 2);
  const milliseconds timeout = p.heartbeat * p.misses;
  const bool recovered = Drive(&fleet, p.heartbeat, SimClock::now() + timeout + std::chrono::seconds(60),
                               [&] { return fleet.all_started.rbegin()->first > epoch; });
  if (!recovered || fleet.first_halt.upper_bound(epoch) == fleet.first_halt.end())
    return Status::Timeout("the silent node's recovery did not finish within 60 s of the timeout");
  // Noticed: the first halt of the recovery (the epochs after `epoch`;
  // placing the spare may take a second one) against the victim's last
  // message plus the timeout. Orders: from then until every node's start.
  const auto noticed = fleet.first_halt.upper_bound(epoch);
  out->detect_over_timeout_ms = Ms(noticed->second - fleet.last_sent(victim)) - static_cast<double>(timeout.count());
  const auto halted = fleet.all_halted.find(noticed->first);
  out->halt_ms = halted == fleet.all_halted.end() ? -1 : Ms(halted->second - noticed->second);
  out->orders_ms = Ms(fleet.all_started.rbegin()->second - noticed->second);
  out->recovery_epochs = fleet.all_started.rbegin()->first - epoch;

  // Another node dies (its connection closes): seen at once, not after a
  // timeout; the second spare takes it.
  const uint64_t before_kill = fleet.all_started.rbegin()->first;
  const SimTime killed = SimClock::now();
  fleet.Kill(p.nodes / 4);
  const bool replaced = Drive(&fleet, p.heartbeat, killed + std::chrono::seconds(60),
                              [&] { return fleet.all_started.rbegin()->first > before_kill; });
  const auto kill_halt = fleet.first_halt.upper_bound(before_kill);
  if (!replaced || kill_halt == fleet.first_halt.end())
    return Status::Timeout("the dead node's recovery did not finish within 60 s");
  coordinator_process.Stop();  // before the agents' transports close (it would log their losses)
  out->dead_noticed_ms = Ms(kill_halt->second - killed);
  out->dead_orders_ms = Ms(fleet.all_started.rbegin()->second - killed);
  return Status::Ok();
}

// What UCX adds to the coordinator per message in or out: the same fleet of
// `nodes` over UCX and in-process (steady phase only).
Status CalibrateUcx(ScaleParams p, int nodes, double* per_message, nlohmann::json* details) {
  p.nodes = nodes;
  p.seconds = std::min(p.seconds, 10);
  p.failures = false;
  ScaleRun ucx, in_process;
  p.over_ucx = true;
  FTRUN_RETURN_IF_ERROR(Measure(p, &ucx));
  p.over_ucx = false;
  FTRUN_RETURN_IF_ERROR(Measure(p, &in_process));
  const double messages = ucx.msgs_in + ucx.msgs_out;
  *per_message = messages > 0 ? std::max(0.0, ucx.cpu - in_process.cpu) / messages : 0;
  *details = {{"nodes", nodes},
              {"cpu_cores_ucx", ucx.cpu},
              {"cpu_cores_in_process", in_process.cpu},
              {"messages_per_s", messages},
              {"commit_p99_ms_ucx", Percentile(ucx.latencies, 0.99)}};
  return Status::Ok();
}

}  // namespace

int RunScale(int argc, char** argv, Result* r) {
  CLI::App app{"ftrun-bench scale: the coordinator against N simulated agents (in-process or UCX transport)"};
  ScaleParams p;
  int heartbeat_ms = 200, calibrate_nodes = 256;
  std::string transport = "inprocess";
  app.add_option("--nodes", p.nodes, "simulated nodes (agents started for a node)");
  app.add_option("--ranks-per-node", p.ranks_per_node, "ranks per node");
  app.add_option("--spares", p.spares, "spare agents");
  app.add_option("--seconds", p.seconds, "seconds of steady saving (one version per second)");
  app.add_option("--heartbeat-ms", heartbeat_ms, "cluster.heartbeat_interval");
  app.add_option("--misses", p.misses, "cluster.heartbeat_misses");
  app.add_option("--seed", p.seed, "the fleet's shuffles");
  app.add_option("--transport", transport,
                 "inprocess: the coordinator on a thread, two mailboxes; ucx: the coordinator in a process of its "
                 "own, a UcxTransport per simulated agent (TCP on loopback)")
      ->check(CLI::IsMember({"inprocess", "ucx"}));
  app.add_option("--calibrate-nodes", calibrate_nodes,
                 "in-process runs: the fleet size run over UCX and in-process to price a message; 0: none");
  CLI11_PARSE(app, argc, argv);
  if (p.nodes < 4 || p.ranks_per_node < 1 || p.spares < 2 || p.seconds < 2 || heartbeat_ms < 1 || p.misses < 1 ||
      calibrate_nodes < 0 || calibrate_nodes == 1) {
    std::fprintf(stderr,
                 "ftrun-bench scale: needs --nodes >= 4, --spares >= 2 (a silent node, then a dead one), --seconds >= "
                 "2, --calibrate-nodes 0 or >= 2, "
                 "and positive --ranks-per-node, --heartbeat-ms, --misses\n");
    return 2;
  }
  p.heartbeat = milliseconds(heartbeat_ms);
  p.over_ucx = transport == "ucx";
  const bool calibrate = !p.over_ucx && calibrate_nodes > 0;
  if (p.over_ucx || calibrate) UseTcpOnLoopback();
  double per_message = 0;
  nlohmann::json calibration;
  if (calibrate) {
    if (Status s = CalibrateUcx(p, calibrate_nodes, &per_message, &calibration); !s.ok()) {
      std::fprintf(stderr, "ftrun-bench scale: the UCX calibration failed: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  ScaleRun run;
  if (Status s = Measure(p, &run); !s.ok()) {
    std::fprintf(stderr, "ftrun-bench scale: %s\n", s.ToString().c_str());
    return 1;
  }

  const double p50 = Percentile(run.latencies, 0.5), p99 = Percentile(run.latencies, 0.99);
  const bool big = p.nodes >= 4096;  // the targets are for 4,096 nodes x 8 ranks
  auto target = [&](const char* t) { return big ? std::string(t) : std::string(); };
  r->figures.push_back({"coordinator_cpu_cores", run.cpu, "cores", target("<= 0.5"), !big || run.cpu <= 0.5});
  if (calibrate) {
    const double ucx = run.cpu + (run.msgs_in + run.msgs_out) * per_message;
    r->figures.push_back({"ucx_cpu_per_message_us", per_message * 1e6, "us", "", true});
    r->figures.push_back(
        {"coordinator_cpu_cores_with_ucx", ucx, "cores (estimate)", target("<= 0.5"), !big || ucx <= 0.5});
  }
  r->figures.push_back({"commit_p50_ms", p50, "ms", "", true});
  r->figures.push_back({"commit_p99_ms", p99, "ms", target("<= 100"), !big || p99 <= 100});
  r->figures.push_back(
      {"silent_detect_over_timeout_ms", run.detect_over_timeout_ms, "ms", "<= 200", run.detect_over_timeout_ms <= 200});
  r->figures.push_back({"halt_delivered_ms", run.halt_ms, "ms", "", true});
  r->figures.push_back({"recovery_orders_ms", run.orders_ms, "ms", target("<= 500"), !big || run.orders_ms <= 500});
  r->figures.push_back({"dead_node_noticed_ms", run.dead_noticed_ms, "ms", "", true});
  r->figures.push_back(
      {"dead_node_orders_ms", run.dead_orders_ms, "ms", target("<= 500"), !big || run.dead_orders_ms <= 500});
  r->figures.push_back({"versions_uncommitted", static_cast<double>(run.uncommitted), "", "0", run.uncommitted == 0});
  r->details = {{"nodes", p.nodes},
                {"ranks_per_node", p.ranks_per_node},
                {"spares", p.spares},
                {"versions", run.versions},
                {"steady_s", run.steady_s},
                {"form_s", run.form_s},
                {"messages_in_per_s", run.msgs_in},
                {"messages_out_per_s", run.msgs_out},
                {"heartbeat_timeout_ms", (p.heartbeat * p.misses).count()},
                {"recovery_epochs", run.recovery_epochs},
                {"commit_latencies_ms", run.latencies},
                {"transport", p.over_ucx ? "ucx: the coordinator's own process (every thread), a UcxTransport per agent"
                                         : "in-process (two mailboxes)"}};
  if (calibrate) r->details["ucx_calibration"] = calibration;
  return 0;
}

}  // namespace ftrun::bench
