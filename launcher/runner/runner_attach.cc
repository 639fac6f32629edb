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

#include "launcher/common/supervisor.h"
#include "launcher/runner/hostfile.h"
#include "launcher/runner/remote_command.h"
#include "launcher/runner/runner_impl.h"
#include "launcher/runner/signed_state.h"
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

namespace {
std::string HostName() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}
}  // namespace

// `ftrun --attach`: the agents the old runner started, as its last status
// listed them, and which node each held.
Status Runner::AdoptAgents(const std::string& before_text) {
  // (From etcd, anyone who may write the job's prefix wrote it: a field of
  // the wrong type is an error naming it, not a crash.)
  try {
    return AdoptAgentsFrom(nlohmann::json::parse(before_text));
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument("ftrun --attach " + job_id_ + ": the old status's agents or nodes: " + e.what());
  }
}

Status Runner::AdoptAgentsFrom(const nlohmann::json& before) {
  const std::string runner_host = before.contains("runner_host") && before["runner_host"].is_string()
                                      ? before["runner_host"].get<std::string>()
                                      : HostName();
  for (const auto& a : before["agents"]) {
    if (!a.is_object())
      return Status::InvalidArgument("ftrun --attach " + job_id_ + ": an agent entry is not an object");
    AgentProc p;
    p.id = a.value("agent", -1);
    p.pid = a.value("pid", 0);
    p.start_time = a.value("start_time", uint64_t{0});
    p.adopted = true;
    if (runner_host != HostName()) {  // its pid means nothing here
      p.pid = 0;
      p.adopted = false;
      p.foreign = true;
    } else if (p.pid > 0 && !SameProcess(p.pid, p.start_time)) {
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
    if (p.foreign) {
      FTRUN_LOG_INFO("adopted agent {} ({}), started from {}", p.id,
                     p.slot >= 0 ? "node " + std::to_string(p.slot) : std::string("spare"), runner_host);
      continue;
    }
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
  if (metrics_) metrics_->metrics().Update(view);
  nlohmann::json j = StatusJson(view);
  j["job_id"] = job_id_;
  j["persist_dir"] = config_.persist.dir;
  j["job_dir"] = job_dir_;
  j["coordinator"] = transport_->address();
  j["runner_pid"] = ::getpid();
  j["runner_start_time"] = ProcessStartTime(::getpid());  // with every pid: see proc_start.h
  j["runner_host"] = HostName();                          // where those pids are
  j["rendezvous_store"] = {{"pid", keeper_.pid()}, {"address", keeper_.current()}};
  j["metrics_address"] = metrics_ ? metrics_->address() : "";
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
  if (lead_) {
    j["coordinator_leader"] = {{"term", lead_->term()}, {"etcd_key", lead_->keys().leader}};
    PublishState(j);
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

Status Runner::Lead() {
  if (!UsesEtcd(config_.coordinator) || lead_) return Status::Ok();  // (a standby's: won already)
  if (nodes_.size() < 2) {
    FTRUN_LOG_INFO("one node: its agent hosts the coordinator; coordinator.etcd_endpoints is not used");
    return Status::Ok();
  }
  lead_ = std::make_unique<Leadership>(config_.coordinator, job_id_);
  Leadership::Outcome outcome;
  std::string end;
  Status s = lead_->Campaign(false, nullptr, &outcome, &end);
  if (!s.ok()) {
    lead_.reset();
    return Status(s.code(), config_.source + ": coordinator.etcd_endpoints: " + s.message());
  }
  return Status::Ok();
}

// The command line, the agents (as AdoptAgents reads them) and where the job
// stands: small, and rewritten only when it changes.
void Runner::PublishState(const nlohmann::json& status) {
  nlohmann::json s = {{"job_id", job_id_},
                      {"coordinator", status["coordinator"]},
                      {"agents", status["agents"]},
                      {"runner_host", status["runner_host"]}};
  s["nodes"] = nlohmann::json::array();
  for (const auto& n : status.value("nodes", nlohmann::json::array())) {
    s["nodes"].push_back({{"node", n.value("node", -1)}, {"agent", n.contains("agent") ? n["agent"] : nullptr}});
  }
  for (const char* k : {"committed_version", "epoch", "restarts"}) {
    if (status.contains(k)) s[k] = status[k];
  }
  std::string text = nlohmann::json{{"argv", o_.argv}, {"cwd", CurrentDirectory()}, {"status", s}}.dump();
  if (text == published_.state) return;
  published_.state = text;
  // Who runs where goes out at once; the committed version may wait a second.
  std::string members = s["agents"].dump() + s["nodes"].dump();
  const bool urgent = members != published_.members;
  published_.members = std::move(members);
  lead_->Publish(SignState(secret_, job_id_, text), urgent);
}

// Cut off from etcd (or another process leads): this process must not send
// the job another order. Its coordinator and transport go (the agents lose
// it and follow etcd to the next leader); its agents and the job's secret
// stay.
void Runner::StepDown(Clock::time_point) {
  stepped_down_ = true;
  FTRUN_LOG_ERROR(
      "coordinator: stepping down, no longer the job's leader ({}); the job goes on under the next "
      "leader (a standby coordinator)",
      lead_->LostWhy());
  coord_.reset();
  outbox_.reset();
  loop_.Remove(transport_->event_fd());
  transport_.reset();
  metrics_.reset();
}

}  // namespace runner_impl
}  // namespace ftrun
