#include "launcher/runner/runner.h"

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
#include <nlohmann/json.hpp>

#include "launcher/common/disk_scan.h"
#include "launcher/common/install_paths.h"
#include "launcher/common/job_id.h"
#include "launcher/common/supervisor.h"
#include "launcher/runner/hostfile.h"
#include "launcher/runner/remote_command.h"
#include "launcher/runner/runner_impl.h"
#include "plugin/common/fd.h"
#include "plugin/common/log.h"
#include "plugin/common/proc_start.h"
#include "plugin/common/safe_dir.h"
#include "plugin/config/config.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"
#include "recovery/coordinator.h"

extern char** environ;

namespace ftrun {
namespace runner_impl {

// Our child (it cannot be reused before we reap it), or an adopted agent
// that is still the process its status recorded.
bool StillOurs(const AgentProc& a) { return a.pid > 0 && (!a.adopted || SameProcess(a.pid, a.start_time)); }

Status Runner::SelectJobNodes() {
  std::vector<HostEntry> hosts;
  FTRUN_RETURN_IF_ERROR(LoadHosts(o_, &hosts));
  const bool implicit_local = hosts.size() == 1 && hosts[0].host == "localhost" && !o_.hostfile_given;
  if (implicit_local && o_.num_nodes > 1) {
    // No hostfile and --num_nodes N: N nodes on this machine.
    hosts.clear();
    for (int i = 0; i < o_.num_nodes; ++i) {
      hosts.push_back({"node" + std::to_string(i), o_.num_gpus > 0 ? o_.num_gpus : 1, "", 0});
    }
  }
  return SelectNodes(hosts, o_.include, o_.exclude, o_.num_nodes, o_.num_gpus, &nodes_);
}

Status Runner::Setup() {
  // First: the transport's thread (started below) inherits the signal mask,
  // so these signals only ever arrive through the loop.
  FTRUN_RETURN_IF_ERROR(loop_.Open({SIGCHLD, SIGTERM, SIGINT, SIGHUP}, std::chrono::milliseconds(20)));
  if (o_.config.empty())
    config_ = DefaultConfig();
  else
    FTRUN_RETURN_IF_ERROR(LoadConfigFile(o_.config, &config_));
  FTRUN_RETURN_IF_ERROR(SelectJobNodes());
  spares_ = o_.spares >= 0 ? o_.spares : config_.cluster.spares;
  if (remote()) {
    // Spares need machines: the last `spares` selected hosts are the spares.
    if (spares_ >= static_cast<int>(nodes_.size())) {
      return Status::InvalidArgument("--launcher " + o_.launcher + " with " + std::to_string(spares_) +
                                     " spares: the spares are the last hosts of the hostfile, and only " +
                                     std::to_string(nodes_.size()) + " are selected; at least one must run ranks");
    }
    for (int i = 0; i < spares_; ++i) spare_hosts_.insert(spare_hosts_.begin(), nodes_[nodes_.size() - 1 - i].host);
    nodes_.resize(nodes_.size() - static_cast<size_t>(spares_));
  }
  int max_slots = 1;
  for (const auto& n : nodes_) max_slots = std::max(max_slots, static_cast<int>(n.slots.size()));
  config_.agent.ranks_per_node = max_slots;
  FTRUN_RETURN_IF_ERROR(ValidateConfig(config_));
  FTRUN_RETURN_IF_ERROR(ValidateClusterConfig(config_, static_cast<int>(nodes_.size())));
  if (std::string advice = ClusterConfigAdvice(config_, static_cast<int>(nodes_.size())); !advice.empty())
    FTRUN_LOG_WARN("{}", advice);
  if (nodes_.size() == 1 && (config_.cluster.replicas > 0 || config_.cluster.erasure.enabled())) {
    FTRUN_LOG_INFO("one node: no peer to copy snapshots to (cluster.redundancy ignored)");
    config_.cluster.replicas = 0;
    config_.cluster.erasure = {};
  }

  job_id_ = config_.job.id;
  if (job_id_.empty() && !config_.persist.dir.empty()) {
    FTRUN_LOG_WARN(
        "persist.dir is set but job.id is not: this run's versions go under a new job id, and a later "
        "run can resume from them only with job.id set to it");
  }
  if (!o_.attach_job.empty()) job_id_ = o_.attach_job;
  if (!job_id_.empty()) FTRUN_RETURN_IF_ERROR(CheckJobId(job_id_, o_.attach_job.empty() ? "job.id" : "--attach"));
  if (job_id_.empty()) {
    // Inside a Slurm allocation the id names it, so the epilog finds what
    // the job left in the run directory (integration/slurm/epilog.sh).
    const char* slurm = std::getenv("SLURM_JOB_ID");
    job_id_ = slurm != nullptr && *slurm != '\0' ? "slurm-" + std::string(slurm) + NewJobId().substr(3) : NewJobId();
  }
  FTRUN_RETURN_IF_ERROR(Lead());  // before anything of a job that may run already is touched
  // The run dir and the job's directory in it: this user's own, every
  // component checked, nothing in them another user could have written.
  job_dir_ = config_.agent.run_dir + "/" + job_id_;
  if (remote() && config_.agent.run_dir == DefaultRunDir()) {
    FTRUN_LOG_WARN(
        "agent.run_dir is the per-user default {}, which other hosts do not see; the agents read the job "
        "secret from {}/secret: set agent.run_dir to a directory every node sees",
        config_.agent.run_dir, job_dir_);
  }
  {
    UniqueFd run_dir;
    FTRUN_RETURN_IF_ERROR(OpenPrivateDir(config_.agent.run_dir, true, "agent.run_dir", &run_dir));
  }
  FTRUN_RETURN_IF_ERROR(OpenPrivateDir(job_dir_, true, "the job directory", &job_dir_fd_));
  secret_file_ = job_dir_ + "/secret";
  nlohmann::json before;  // an attach: the old runner's status (its coordinator and agents)
  if (o_.attach_job.empty()) {
    ::unlinkat(job_dir_fd_.get(), "secret", 0);
    FTRUN_RETURN_IF_ERROR(WriteNewSecretFile(secret_file_));
  } else {
    // A standby coordinator's: the state its job's last leader kept in etcd.
    std::string text = o_.attach_state;
    const std::string from = text.empty() ? job_dir_ + "/status.json" : "etcd key " + lead_->keys().state;
    if (text.empty()) FTRUN_RETURN_IF_ERROR(ReadPrivateFile(job_dir_ + "/status.json", 16u << 20, &text));
    before = nlohmann::json::parse(text, nullptr, false);
    if (before.is_discarded() || !before.is_object() || !before.contains("coordinator") ||
        !before["coordinator"].is_string() || !before.contains("agents") || !before["agents"].is_array()) {
      return Status::InvalidArgument("ftrun --attach " + job_id_ + ": " + from +
                                     " is missing or has no 'coordinator' (a string) and 'agents' (a list)");
    }
  }

  UcxTransportOptions t;
  t.self = kCoordinatorPeer;
  t.listen_ip = o_.coordinator_addr;
  if (!o_.attach_job.empty() && !lead_) {  // where the agents look for it (with etcd: where etcd says)
    std::string addr = before["coordinator"].get<std::string>();
    t.listen_ip = addr.substr(0, addr.rfind(':'));
    t.listen_port = static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
  }
  if (remote() && t.listen_ip == "127.0.0.1") {  // the default: agents elsewhere cannot reach it
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    FTRUN_RETURN_IF_ERROR(ResolveIpv4(name, "this host's name (for --coordinator_addr)", &t.listen_ip));
  }
  FTRUN_RETURN_IF_ERROR(ReadSecretFile(secret_file_, &t.secret));
  secret_ = t.secret;
  FTRUN_RETURN_IF_ERROR(CreateUcxTransport(t, &transport_));
  outbox_ = std::make_unique<TransportOutbox>(transport_.get(), lead_ ? lead_->term() : 0);
  if (lead_) lead_->Announce(transport_->address());
  Coordinator::Options co = Coordinator::Options::FromConfig(config_);
  for (const auto& n : nodes_) {
    co.ranks_per_slot.push_back(static_cast<int>(n.slots.size()));
    co.racks.push_back(n.rack);
  }
  co.master_port = o_.master_port;
  if (!config_.persist.dir.empty()) {
    int world = 0;
    for (const auto& n : nodes_) world += static_cast<int>(n.slots.size());
    FTRUN_RETURN_IF_ERROR(disk_worker_.Start());
    co.scan_disk = [this, dir = config_.persist.dir, job = job_id_, world] {
      disk_worker_.Submit([this, dir, job, world]() -> DiskWorker::Completion {
        std::vector<uint64_t> versions;
        Status s = ScanDiskVersions(dir, job, world, &versions);
        return [this, s, versions]() { coord_->DiskScanned(s, versions, Clock::now()); };
      });
    };
  }
  if (!o_.no_python && config_.restart.warm_standbys != 0) {
    // Where the agents reach the coordinator, their ranks reach the store.
    const std::string at = transport_->address();
    Status s = keeper_.Start(PythonInterpreter(), at.substr(0, at.rfind(':')));
    if (!s.ok()) FTRUN_LOG_WARN("no rendezvous store of the job's own (rank 0 hosts it): {}", s.message());
    co.store_address = [this] { return keeper_.Take(); };  // a store per generation
  }
  coord_ = std::make_unique<Coordinator>(co, outbox_.get());
  if (!config_.metrics.coordinator_listen.empty()) {
    Status ms = ServedMetrics<JobMetrics>::Start(config_.metrics.coordinator_listen, &metrics_, job_id_);
    if (ms.ok()) {
      FTRUN_LOG_INFO("job metrics at http://{}/metrics", metrics_->address());
    } else {
      FTRUN_LOG_WARN("{} (metrics.coordinator_listen): the job runs without them", ms.message());
    }
  }

  FTRUN_RETURN_IF_ERROR(loop_.Add(transport_->event_fd(), kTransportTag));
  if (disk_worker_.event_fd() >= 0) FTRUN_RETURN_IF_ERROR(loop_.Add(disk_worker_.event_fd(), kDiskTag));
  const ErasureConfig& ec = config_.cluster.erasure;
  FTRUN_LOG_INFO("job {}: {} nodes + {} spares, {} ranks, {}; coordinator at {}", job_id_, nodes_.size(), spares_,
                 TotalSlots(nodes_),
                 ec.enabled() ? "erasure code " + std::to_string(ec.data) + "+" + std::to_string(ec.parity)
                              : "replicas " + std::to_string(config_.cluster.replicas),
                 transport_->address());
  if (!o_.attach_job.empty()) return AdoptAgents(before.dump());
  {
    nlohmann::json r;  // what `ftrun --attach` needs to take the job over
    r["argv"] = o_.argv;
    r["cwd"] = CurrentDirectory();
    FTRUN_RETURN_IF_ERROR(ReplaceFileAt(job_dir_fd_.get(), job_dir_, "runner.json", r.dump(1) + "\n"));
  }
  for (int a = 0; a < static_cast<int>(nodes_.size()) + spares_; ++a) {
    AgentProc p;
    p.id = a;
    p.slot = a < static_cast<int>(nodes_.size()) ? a : -1;
    if (p.slot >= 0)
      p.host = nodes_[static_cast<size_t>(p.slot)].host;
    else if (remote())
      p.host = spare_hosts_[static_cast<size_t>(a) - nodes_.size()];
    agents_.push_back(p);
    FTRUN_RETURN_IF_ERROR(SpawnAgent(agents_.back(), p.slot < 0));
  }
  return Status::Ok();
}

Status Runner::SpawnAgent(AgentProc& a, bool as_spare) {
  SpawnSpec spec;
  // Agents outlive a runner that dies (up to cluster.lost_node_timeout, their
  // ranks fenced), so `ftrun --attach` can take the job over.
  spec.die_with_parent = false;
  std::string listen;
  if (remote() && o_.agent_addr == "127.0.0.1") {  // the default: the host's own address
    FTRUN_RETURN_IF_ERROR(ResolveIpv4(a.host, "host", &listen));
  } else {
    FTRUN_RETURN_IF_ERROR(AgentAddress(o_.agent_addr, a.id, &listen));
  }
  if (!o_.agent_exec_prefix.empty()) {
    FTRUN_RETURN_IF_ERROR(ShellSplit(ExpandNodeTemplate(o_.agent_exec_prefix, a.id), &spec.argv));
  }
  const NodeSlots& node = nodes_[static_cast<size_t>(a.slot >= 0 ? a.slot : 0)];
  std::vector<std::string> v;
  v.push_back(SelfDir() + "/ftrun-agent");
  v.insert(v.end(), {"--coordinator", transport_->address(),
                     "--agent-id",    std::to_string(a.id),
                     "--node_rank",   std::to_string(a.slot >= 0 ? a.slot : 0),
                     "--secret-file", secret_file_,
                     "--job-id",      job_id_,
                     "--listen",      listen,
                     "--nproc",       std::to_string(node.slots.size()),
                     "--master_addr", ResolveMasterAddr(o_, nodes_),
                     "--master_port", std::to_string(o_.master_port),
                     "--log-level",   o_.log_level,
                     "--run-dir",     config_.agent.run_dir,
                     "--status-file", job_dir_ + "/agent" + std::to_string(a.id) + ".json"});
  if (!o_.config.empty()) v.insert(v.end(), {"--config", o_.config});
  if (as_spare) v.push_back("--spare");
  if (!node.rack.empty() && !as_spare) v.insert(v.end(), {"--rack", node.rack});
  if (o_.module) v.push_back("--module");
  if (o_.no_python) v.push_back("--no_python");
  if (o_.no_local_rank) v.push_back("--no_local_rank");
  if (!o_.enable_each_rank_log.empty()) v.insert(v.end(), {"--enable_each_rank_log", o_.enable_each_rank_log});
  v.push_back("--");
  v.insert(v.end(), o_.command.begin(), o_.command.end());
  for (char** e = environ; *e; ++e) spec.env.push_back(*e);
  spec.env.push_back("FTRUN_JOB_ID=" + job_id_);
  if (!remote()) {
    spec.argv.insert(spec.argv.end(), v.begin(), v.end());
  } else {
    AgentLaunch l;
    l.launcher = o_.launcher;
    FTRUN_RETURN_IF_ERROR(ShellSplit(o_.launcher_args, &l.launcher_args));
    l.ssh_port = o_.ssh_port;
    l.host = a.host;
    l.cwd = CurrentDirectory();
    const char* home = ::getenv("HOME");
    l.env = ForwardedEnv(environ, {std::string(home ? home : "") + "/.deepspeed_env", "./.deepspeed_env"});
    l.env.push_back("FTRUN_JOB_ID=" + job_id_);
    l.agent_argv = std::move(v);
    l.as_root = ::geteuid() == 0;
    std::vector<std::string> launch;
    FTRUN_RETURN_IF_ERROR(BuildLaunchArgv(l, &launch));
    spec.argv.insert(spec.argv.end(), launch.begin(), launch.end());
  }
  FTRUN_RETURN_IF_ERROR(SpawnProcess(spec, &a.pid));
  a.start_time = ProcessStartTime(a.pid);
  FTRUN_LOG_INFO("started agent {} ({}){} as pid {}", a.id,
                 as_spare ? std::string("spare") : "node " + std::to_string(a.slot),
                 remote() ? " on " + a.host + " with " + o_.launcher : std::string(), a.pid);
  return Status::Ok();
}

void Runner::Reaped(pid_t pid, const ExitInfo& info) {
  if (keeper_.Reaped(pid, info)) return;
  for (AgentProc& a : agents_) {
    if (a.pid != pid) continue;
    a.pid = 0;
    if (coord_->done() || signal_ != 0) return;
    FTRUN_LOG_ERROR("agent {} (pid {}) {}", a.id, pid, info.Describe());
    // A local "node" came back after a crash: as a spare when the job keeps
    // spares (its node has likely been taken over), else as its node.
    if (a.respawns >= config_.job.max_restarts + 1) return;
    a.respawns++;
    bool as_spare = spares_ > 0;
    if (as_spare) a.slot = -1;
    Status s = SpawnAgent(a, as_spare);
    if (!s.ok()) FTRUN_LOG_ERROR("cannot restart agent {}: {}", a.id, s.message());
    return;
  }
}

void Runner::Loop() {
  std::vector<EventLoop::Ready> ready;
  while (true) {
    if (Status s = loop_.Wait(&ready); !s.ok()) {
      FTRUN_LOG_ERROR("{}", s.message());
      if (!coord_->done()) coord_->Shutdown(1, s.message());
      return;
    }
    auto now = Clock::now();
    if (lead_ && !lead_->Leading(now)) return StepDown(now);  // before anything is sent
    for (const EventLoop::Ready& r : ready) {
      if (r.tag == EventLoop::kSignalTag) {
        for (int sig : loop_.TakeSignals()) {
          if (sig == SIGCHLD) {
            pid_t pid;
            ExitInfo info;
            while (ReapOne(&pid, &info)) Reaped(pid, info);
          } else if (signal_ == 0) {
            signal_ = sig;
            FTRUN_LOG_WARN("received signal {}: stopping the job", signal_);
            coord_->Shutdown(128 + signal_, "the runner received signal " + std::to_string(signal_));
          }
        }
      } else if (r.tag == EventLoop::kTickTag) {
        loop_.TakeTicks();
        keeper_.Poll();
        coord_->Tick(now);
        CheckAdopted();
      } else if (r.tag == kDiskTag) {
        disk_worker_.RunCompleted();  // a scan's answer: the coordinator goes on
      } else {
        for (TransportEvent& e : transport_->Poll()) {
          if (e.kind == TransportEvent::Kind::kMessage)
            coord_->OnMessage(e.peer, e.type, e.payload, now);
          else if (e.kind == TransportEvent::Kind::kPeerDown)
            coord_->OnPeerDown(e.peer, e.status.message(), now);
        }
      }
    }
    if (now - last_status_ > std::chrono::milliseconds(200)) WriteStatus();
    bool any = false;
    // (An agent adopted on another host is watched through the coordinator: alive until the job is done.)
    for (const AgentProc& a : agents_) any |= a.pid != 0 || (a.foreign && !coord_->done());
    if (!any) {
      if (!coord_->done()) coord_->Shutdown(1, "every agent is gone");
      return;
    }
    if (coord_->done()) {
      if (!ending_since_) ending_since_ = now;
      // Agents end by writing the last committed version to disk (bounded
      // by persist.drain_timeout) when a persist dir is set.
      auto bound = config_.job.stop_grace + std::chrono::seconds(10) +
                   (config_.persist.dir.empty() ? std::chrono::milliseconds(0) : config_.persist.drain_timeout);
      if (now - *ending_since_ > bound) {
        for (const AgentProc& a : agents_) {
          if (StillOurs(a)) {
            FTRUN_LOG_WARN("agent {} did not exit: SIGKILL", a.id);
            SignalGroup(a.pid, SIGKILL);
          }
        }
        ending_since_ = now;  // reaped soon
      }
    }
  }
}

int Runner::Run() {
  Status s = Setup();
  if (!s.ok()) {
    FTRUN_LOG_ERROR("{}", s.message());
    // A fresh job that cannot start ends for its standbys too; a standby that
    // cannot take over lets its lease lapse for another.
    if (lead_ && o_.attach_job.empty()) lead_->End(2, s.message());
    for (const AgentProc& a : agents_) {
      if (StillOurs(a)) SignalGroup(a.pid, SIGKILL);
    }
    return 2;
  }
  Loop();
  if (stepped_down_) return 0;  // the job goes on under another coordinator
  WriteStatus();
  if (lead_) lead_->End(signal_ != 0 ? 128 + signal_ : coord_->exit_code(), coord_->exit_message());
  if (job_dir_fd_.valid()) ::unlinkat(job_dir_fd_.get(), "secret", 0);
  if (signal_ != 0) return 128 + signal_;
  if (coord_->exit_code() != 0) FTRUN_LOG_ERROR("job failed: {}", coord_->exit_message());
  return coord_->exit_code();
}

}  // namespace runner_impl
}  // namespace ftrun
