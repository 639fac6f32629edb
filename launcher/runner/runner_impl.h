// The runner's insides, shared by its .cc files (runner.cc: setup of the
// job, spawning and reaping agents, the loop; runner_attach.cc: adopting a
// dead runner's agents and the status file). Not an interface: use runner.h.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/supervisor.h"
#include "launcher/common/disk_worker.h"
#include "launcher/common/event_loop.h"
#include "launcher/common/metrics_endpoint.h"
#include "launcher/runner/hostfile.h"
#include "launcher/runner/job_metrics.h"
#include "launcher/runner/rendezvous_keeper.h"
#include "launcher/runner/runner_options.h"
#include "plugin/common/fd.h"
#include "plugin/config/config.h"
#include "plugin/transport/transport.h"
#include "recovery/coordinator.h"

namespace ftrun {
namespace runner_impl {

using Clock = std::chrono::steady_clock;

class TransportOutbox : public Coordinator::Outbox {
 public:
  explicit TransportOutbox(Transport* t) : t_(t) {}
  void Send(PeerId to, ClusterMsg type, std::string payload) override {
    t_->Send(to, static_cast<uint16_t>(type), std::move(payload));
  }
  void Disconnect(PeerId peer) override { t_->Disconnect(peer); }

 private:
  Transport* t_;
};

struct AgentProc {
  int id = 0;
  int slot = -1;     // as started; -1 = spare
  std::string host;  // where a remote launcher starts it
  pid_t pid = 0;
  uint64_t start_time = 0;  // of pid (proc_start.h): written next to it, checked before an adopted pid is signalled
  int respawns = 0;
  bool adopted = false;  // started by an earlier runner (`ftrun --attach`): not our child
};

class Runner {
 public:
  explicit Runner(const RunnerOptions& o) : o_(o) {}
  int Run();

 private:
  Status Setup();
  Status SelectJobNodes();
  Status SpawnAgent(AgentProc& a, bool as_spare);
  void Loop();
  void Reaped(pid_t pid, const ExitInfo& info);
  void WriteStatus();
  Status AdoptAgents(const std::string& coordinator);
  void CheckAdopted();

  RunnerOptions o_;
  Config config_;
  std::vector<NodeSlots> nodes_;
  int spares_ = 0;
  std::vector<std::string> spare_hosts_;  // remote launchers: the hosts spares run on
  bool remote() const { return o_.launcher != "local"; }
  std::string job_id_, job_dir_, secret_file_;
  UniqueFd job_dir_fd_;       // job_dir_, checked (safe_dir.h): runner.json and status.json are written in it
  std::string status_error_;  // the last status write error logged (logged once)
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<TransportOutbox> outbox_;
  std::unique_ptr<Coordinator> coord_;
  RendezvousKeeper keeper_;                            // the job's rendezvous store (jobs that can recover warm)
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;  // metrics.coordinator_listen; set with the status
  std::unique_ptr<JobMetrics> metrics_;
  DiskWorker disk_worker_;  // scans the persist directory for the coordinator, off the loop
  std::vector<AgentProc> agents_;
  EventLoop loop_;  // epoll, signals, the tick
  static constexpr uint64_t kTransportTag = 1;
  static constexpr uint64_t kDiskTag = 2;
  int signal_ = 0;
  std::optional<Clock::time_point> ending_since_;
  Clock::time_point last_status_;
};

// The first IPv4 address of `host`, for agents and the coordinator that
// remote launchers start elsewhere.
Status ResolveIpv4(const std::string& host, const std::string& what, std::string* out);
// The directory of this executable.
std::string SelfDir();
// --agent_addr: a template ("10.0.0.{node}") or one address per agent,
// comma-separated; agent `agent`'s address.
Status AgentAddress(const std::string& spec, int agent, std::string* out);
// Our child (it cannot be reused before we reap it), or an adopted agent
// that is still the process its status recorded.
bool StillOurs(const AgentProc& a);

}  // namespace runner_impl
}  // namespace ftrun
