// The runner's insides, shared by its .cc files (runner.cc: setup of the
// job, spawning and reaping agents, the loop; runner_attach.cc: adopting a
// dead runner's agents and the status file). Not an interface: use runner.h.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launcher/common/disk_worker.h"
#include "launcher/common/event_loop.h"
#include "launcher/common/metrics_endpoint.h"
#include "launcher/common/supervisor.h"
#include "launcher/runner/hostfile.h"
#include "launcher/runner/job_metrics.h"
#include "launcher/runner/leadership.h"
#include "launcher/runner/rendezvous_keeper.h"
#include "launcher/runner/runner_options.h"
#include "plugin/common/fd.h"
#include "plugin/config/config.h"
#include "plugin/transport/transport.h"
#include "recovery/coordinator.h"

namespace ftrun {
namespace runner_impl {

using Clock = std::chrono::steady_clock;

// term > 0 (coordinator.etcd): every message carries the leader's term.
class TransportOutbox : public Coordinator::Outbox {
 public:
  TransportOutbox(Transport* t, int64_t term) : t_(t), term_(term) {}
  void Send(PeerId to, ClusterMsg type, std::string payload) override {
    t_->Send(to, static_cast<uint16_t>(type), term_ > 0 ? WithTerm(term_, std::move(payload)) : std::move(payload));
  }
  void Disconnect(PeerId peer) override { t_->Disconnect(peer); }

 private:
  Transport* t_;
  int64_t term_;
};

struct AgentProc {
  int id = 0;
  int slot = -1;     // as started; -1 = spare
  std::string host;  // where a remote launcher starts it
  pid_t pid = 0;
  uint64_t start_time = 0;  // of pid (proc_start.h): written next to it, checked before an adopted pid is signalled
  int respawns = 0;
  bool adopted = false;  // started by an earlier runner (`ftrun --attach`): not our child
  bool foreign = false;  // adopted from a runner on another host: its pid is not one of this host's
};

class Runner {
 public:
  // won: a standby coordinator's leadership of the job (its Campaign won).
  explicit Runner(const RunnerOptions& o, std::unique_ptr<Leadership> won = nullptr) : o_(o), lead_(std::move(won)) {}
  int Run();
  // Run returned because this coordinator lost its etcd lease: it must
  // not act for the job again (it may campaign anew).
  bool stepped_down() const { return stepped_down_; }
  const Config& config() const { return config_; }
  const std::string& job_id() const { return job_id_; }

 private:
  Status Setup();
  Status SelectJobNodes();
  Status SpawnAgent(AgentProc& a, bool as_spare);
  void Loop();
  void Reaped(pid_t pid, const ExitInfo& info);
  void WriteStatus();
  Status AdoptAgents(const std::string& coordinator);
  Status AdoptAgentsFrom(const nlohmann::json& before);
  void CheckAdopted();
  Status Lead();                                    // coordinator.etcd: the job's leadership (a fresh run campaigns)
  void PublishState(const nlohmann::json& status);  // what a successor needs
  void StepDown(Clock::time_point now);

  RunnerOptions o_;
  Config config_;
  std::vector<NodeSlots> nodes_;
  int spares_ = 0;
  std::vector<std::string> spare_hosts_;  // remote launchers: the hosts spares run on
  bool remote() const { return o_.launcher != "local"; }
  std::string job_id_, job_dir_, secret_file_;
  std::string secret_;        // the job secret: signs the state in etcd (signed_state.h)
  UniqueFd job_dir_fd_;       // job_dir_, checked (safe_dir.h): runner.json and status.json are written in it
  std::string status_error_;  // the last status write error logged (logged once)
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<TransportOutbox> outbox_;
  std::unique_ptr<Coordinator> coord_;
  RendezvousKeeper keeper_;                             // the job's rendezvous store (jobs that can recover warm)
  std::unique_ptr<ServedMetrics<JobMetrics>> metrics_;  // metrics.coordinator_listen; set with the status
  DiskWorker disk_worker_;                              // scans the persist directory for the coordinator, off the loop
  std::vector<AgentProc> agents_;
  EventLoop loop_;  // epoll, signals, the tick
  static constexpr uint64_t kTransportTag = 1;
  static constexpr uint64_t kDiskTag = 2;
  int signal_ = 0;
  std::optional<Clock::time_point> ending_since_;
  Clock::time_point last_status_;
  std::unique_ptr<Leadership> lead_;  // coordinator.etcd (multi-node jobs)
  struct {
    std::string state;    // the successor state last handed to lead_
    std::string members;  // its agents and nodes
  } published_;
  bool stepped_down_ = false;
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
