// The agent and its ranks' generations (generations.h): what they are wired
// to, how a rank's process is started, the signals and the tick.
#include <signal.h>

#include "launcher/agent/agent.h"
#include "launcher/agent/rank_env.h"
#include "plugin/common/log.h"

namespace ftrun {

Generations::Parts Agent::GenerationParts() {
  Generations::Parts p;
  p.ranks = ranks_.get();
  p.server = server_.get();
  p.recoveries = recoveries_.get();
  p.retention = store_.retention();
  p.corrupt = corrupt_.get();
  p.store = store_.catalog();
  p.tracker = store_.tracker();
  p.member = member_.get();
  p.warm = warm_.get();
  return p;
}

WarmRanks::Hooks Agent::WarmHooks() {
  WarmRanks::Hooks h;
  h.spawn_standby = [this](pid_t* pid) { return SpawnStandby(pid); };
  h.variables = [this](const RankSlot& s, int generation) {
    return RankVariables(o_, RankIdentity{s.local_rank, s.global_rank, generation, lock_.socket_path()});
  };
  h.job_id = [this] { return o_.job_id; };
  h.raised = [this](RankSlot& s, const std::string& reason) { generations_->RankRaised(s, reason); };
  h.quiet = [this] {
    if (ranks_->slots().empty()) return true;  // a spare: nothing to take CPU from
    if (!generations_->running()) return false;
    for (const RankSlot& s : ranks_->slots()) {
      if (s.first_step == RankProcesses::Time{} && !s.finished) return false;
    }
    return true;
  };
  h.changed = [this] { status_dirty_ = true; };
  return h;
}

// A warm standby: the ranks' command line (local rank 0's: the decorator
// gives it its own when it gets a rank), no rank's variables, its output
// the agent's.
Status Agent::SpawnStandby(pid_t* pid) {
  SpawnSpec spec;
  spec.argv = BuildRankCommand(o_, 0);
  spec.env = BuildStandbyEnv(o_, lock_.socket_path());
  return SpawnProcess(spec, pid);
}

Generations::Hooks Agent::GenerationHooks() {
  Generations::Hooks h;
  h.spawn = [this](RankSlot& s, int generation) { return SpawnRank(s, generation); };
  h.last_words = [this](const RankSlot& s) { return LastWords(s); };
  h.waiting = [this](const RankSlot& s) {
    const Connection* c = server_->Find(s.conn_id);
    return c != nullptr && store_.service()->Waiting(*c);
  };
  h.starting = [this](const StartMsg& m) {
    fenced_ = false;  // re-admitted
    if (m.version) Committed(*m.version);
    o_.master_addr = m.master_addr;
    o_.master_port = m.master_port;
    o_.rendezvous_store = m.store;
  };
  h.node_rank = [this] { return o_.node_rank; };
  h.changed = [this] { status_dirty_ = true; };
  return h;
}

Status Agent::SpawnRank(RankSlot& s, int generation) {
  RankIdentity id{s.local_rank, s.global_rank, generation, lock_.socket_path()};
  SpawnSpec spec;
  spec.argv = BuildRankCommand(o_, s.local_rank);
  spec.env = BuildRankEnv(o_, id);
  if (!o_.each_rank_log_dir.empty()) spec.log_file = RankLogPath(o_.each_rank_log_dir, s.global_rank);
  UniqueFd stdout_pipe, stderr_pipe;
  FTRUN_RETURN_IF_ERROR(rank_output_ ? rank_output_->NewPipes(s.global_rank, &stdout_pipe, &stderr_pipe)
                                     : Status::Ok());
  spec.stdout_fd = stdout_pipe.get();
  spec.stderr_fd = stderr_pipe.get();
  return ranks_->Spawn(s, spec);
}

// What a rank said last: its stderr pipe's tail, or its own log file's.
std::string Agent::LastWords(const RankSlot& s) {
  constexpr size_t kLines = 10;
  if (rank_output_) return rank_output_->Tail(s.global_rank, kLines);
  return FileTail(RankLogPath(o_.each_rank_log_dir, s.global_rank), kLines);
}

void Agent::Signals() {
  for (int sig : loop_.TakeSignals()) {
    if (sig == SIGCHLD) {
      pid_t pid;
      ExitInfo info;
      while (ReapOne(&pid, &info)) generations_->ChildExited(pid, info);
    } else {
      generations_->Signal(sig);
    }
  }
}

void Agent::Tick() {
  loop_.TakeTicks();
  auto now = clock_.Now();
  store_.service()->Tick(now);
  disk_->Tick(now);
  server_->Tick();  // silent connections, a paused listen
  ranks_->Tick();   // a stop past its grace, the drain
  warm_->Tick();    // survivors past restart.abort_timeout, standbys to start
  generations_->CheckHung();
  member_->Tick(now);
  if (store_.prefault_news()) status_dirty_ = true;
  const auto since = now - last_status_write_;
  if ((status_dirty_ && since > std::chrono::milliseconds(200)) || (metrics_ && since > std::chrono::seconds(1)))
    WriteStatus();
}

}  // namespace ftrun
