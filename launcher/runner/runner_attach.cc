// The runner's view kept for a successor: adopting the agents of a runner that died (ftrun --attach), and
// the status file (runner_impl.h).
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>

#include "launcher/agent/options.h"
#include "launcher/agent/supervisor.h"
#include "launcher/runner/hostfile.h"
#include "launcher/runner/remote_command.h"
#include "launcher/runner/runner_impl.h"
#include "plugin/common/fd.h"
#include "plugin/common/log.h"
#include "plugin/common/proc_start.h"
#include "plugin/common/safe_dir.h"
#include "plugin/config/config.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"
#include "recovery/coordinator.h"
#include "recovery/coordinator_json.h"

extern char** environ;

namespace ftrun {
namespace runner_impl {

// `ftrun --attach`: the agents the old runner started, as its last status
// listed them, and which node each held.
Status Runner::AdoptAgents(const std::string& before_text) {
  nlohmann::json before = nlohmann::json::parse(before_text);
  for (const auto& a : before["agents"]) {
    AgentProc p;
    p.id = a.value("agent", -1);
    p.pid = a.value("pid", 0);
    p.start_time = a.value("start_time", uint64_t{0});
    p.adopted = true;
    if (p.pid > 0 && !SameProcess(p.pid, p.start_time)) {
      // The pid was reused (or the status predates start times): never wait
      // on or signal a process that is not the agent.
      FTRUN_LOG_WARN(
          "agent {}: pid {} is not the process the old status recorded (start time {}, now {}): "
          "treated as gone, not adopted",
          p.id, p.pid, p.start_time, ProcessStartTime(p.pid));
      p.pid = 0;
      p.adopted = false;
    }
    for (const auto& n : before.value("nodes", nlohmann::json::array())) {
      if (n.contains("agent") && n["agent"].is_number() && n["agent"].get<int>() == p.id) p.slot = n.value("node", -1);
    }
    if (p.slot >= 0 && p.slot < static_cast<int>(nodes_.size())) p.host = nodes_[static_cast<size_t>(p.slot)].host;
    agents_.push_back(p);
    if (!p.adopted) continue;
    FTRUN_LOG_INFO("adopted agent {} (pid {}, {})", p.id, p.pid,
                   p.slot >= 0 ? "node " + std::to_string(p.slot) : std::string("spare"));
  }
  if (agents_.empty()) return Status::InvalidArgument("ftrun --attach " + job_id_ + ": the old status lists no agents");
  CheckAdopted();
  return Status::Ok();
}

// Adopted agents are not our children: notice their end by polling.
void Runner::CheckAdopted() {
  for (AgentProc& a : agents_) {
    if (!a.adopted || a.pid <= 0 || StillOurs(a)) continue;
    a.adopted = false;
    Reaped(a.pid, ExitInfo{false, 1});
  }
}

void Runner::WriteStatus() {
  last_status_ = Clock::now();
  const CoordinatorView view = coord_->View();
  if (metrics_) metrics_->Update(view);
  nlohmann::json j = StatusJson(view);
  j["job_id"] = job_id_;
  j["persist_dir"] = config_.persist.dir;
  j["job_dir"] = job_dir_;
  j["coordinator"] = transport_->address();
  j["runner_pid"] = ::getpid();
  j["runner_start_time"] = ProcessStartTime(::getpid());  // with every pid: see proc_start.h
  j["rendezvous_store"] = {{"pid", keeper_.pid()}, {"address", keeper_.address()}};
  j["metrics_address"] = metrics_endpoint_ ? metrics_endpoint_->address() : "";
  j["updated_unix_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  j["agents"] = nlohmann::json::array();
  for (const AgentProc& a : agents_) {
    j["agents"].push_back({{"agent", a.id},
                           {"pid", a.pid},
                           {"start_time", a.start_time},
                           {"status_file", job_dir_ + "/agent" + std::to_string(a.id) + ".json"}});
  }
  // Always in the job's directory, where `ftrun status` looks; also where
  // --status_file says.
  // Never written through a link (safe_dir.h).
  const std::string text = j.dump(2) + "\n";
  Status s = ReplaceFileAt(job_dir_fd_.get(), job_dir_, "status.json", text);
  if (s.ok() && !o_.status_file.empty()) s = ReplaceFile(o_.status_file, text, false);
  if (!s.ok() && s.message() != status_error_) FTRUN_LOG_WARN("cannot write the job status: {}", s.message());
  status_error_ = s.ok() ? std::string() : s.message();
}

}  // namespace runner_impl
}  // namespace ftrun
