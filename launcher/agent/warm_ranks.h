// WarmRanks: warm recovery of this node's ranks. A rank process that runs
// its training function under @ftrun.resilient (ftrun/warm.py) opens a
// second connection to the agent, its control link, and says so
// (kWarmHello). When the generation stops for a failure, such a survivor is
// not killed: it is told to leave the generation (kWarmAbort), and once out
// of the decorated function with its process group gone it parks
// (kWarmParked). The next start resumes it in place (kWarmStart: the new
// generation, the version to restore and its rank's variables, a fresh
// MASTER_PORT among them). A dead rank's place goes to a warm standby: a
// process started ahead of time with the same command line and
// FTRUN_WARM_STANDBY=1, its interpreter up and the script imported, waiting
// inside the decorator for a rank; a used standby is replaced in the
// background, once the recovery is over. A survivor not parked within restart.abort_timeout, one whose
// link closes, or one that dies is killed and replaced like a dead rank,
// and with no standby left a rank is started cold, as without the
// decorator.
//
// Standbys never join a generation before they are given a rank; how many
// the node keeps is restart.warm_standbys (auto: one once a rank of this
// node said it runs under the decorator, none on a spare node).
//
// Not thread-safe: driven by the agent's event loop, on a Clock.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/rank_processes.h"
#include "launcher/agent/rank_server.h"
#include "plugin/protocol/warm_fields.h"

namespace ftrun {

class WarmRanks {
 public:
  using Slot = RankProcesses::Slot;

  struct Hooks {
    std::function<Status(pid_t* pid)> spawn_standby;  // in its own process group
    // The variables a rank of `generation` is started with (rank_env.h).
    std::function<WarmFields(const Slot& slot, int generation)> variables;
    std::function<std::string()> job_id;
    // A running rank's training function raised (kWarmFailed): its
    // generation fails; the process leaves it and parks by itself.
    std::function<void(Slot& slot, const std::string& reason)> raised;
    std::function<void()> changed;  // something the status shows
    // No recovery under way (every rank stepped in this generation): a
    // standby's start-up (Python, import torch) would take CPU from it.
    std::function<bool()> quiet;
  };
  struct Options {
    int standbys = -1;  // restart.warm_standbys; -1: auto
    std::chrono::milliseconds abort_timeout{5000};
  };
  // How the ranks of a start were started.
  struct Resumed {
    int survivors = 0, standbys = 0, cold = 0;
  };

  WarmRanks(RankProcesses* ranks, RankServer* server, Hooks hooks, Options o, const Clock& clock);
  ~WarmRanks();

  // The control links' frames (kWarm*), and a link closing.
  void Frame(Connection& conn, MsgType type, const std::string& payload);
  void Closed(Connection& conn);

  // The generation stops for a failure: its survivors are told to leave it.
  // `left` runs once each is parked or gone (at once when there are none).
  void Abort(int generation, std::function<void()> left);
  // A rank's process exited (after RankProcesses::Exited).
  void SlotExited();
  // A standby's exit: true when `pid` was one.
  bool StandbyExited(pid_t pid);
  // A generation starts: its ranks follow (Resume, or started cold).
  void Begin(int generation) {
    generation_ = generation;
    resumed_ = {};
  }
  // Starts `slot` in `generation` warm: its parked survivor, else a standby
  // (waited for when not yet up). False: start it cold.
  bool Resume(Slot& slot, int generation, const std::optional<uint64_t>& restore);
  // The job ends: standbys go, and survivors are no longer kept (killed).
  void Release();
  // Abort deadlines; standbys started up to the wanted number.
  void Tick();

  const Resumed& resumed() const { return resumed_; }
  int standbys_ready() const;
  nlohmann::json ToJson() const;

 private:
  struct Standby {
    pid_t pid = 0;
    uint64_t control_id = 0;  // 0 until its hello
    Clock::Time started;
    int assigned = -1;  // the global rank it was given before its hello: started as it then
    int generation = -1;
    std::optional<uint64_t> restore;
  };

  void Hello(Connection& conn, const std::string& payload);
  void Parked(Connection& conn, const std::string& payload);
  void Raised(Connection& conn, const std::string& payload);
  Slot* SlotFrame(Connection& conn, const std::string& payload, Slot::Warm in, int generation, WarmFields* f);
  void SendStart(uint64_t control_id, const Slot& slot, int generation, const std::optional<uint64_t>& restore);
  void Unkeep(Slot& slot, const std::string& why);  // killed; its place goes to a standby
  void ShutDownConnections(Slot& slot);             // its generation's (release_connections.h)
  void CheckLeft();
  void Refill();
  int wanted() const;
  Slot* SlotOf(uint64_t control_id);

  RankProcesses* ranks_;
  RankServer* server_;
  const Hooks h_;
  const Options o_;
  const Clock& clock_;
  std::vector<Standby> standbys_;
  bool decorated_ = false;  // a rank of this node said it runs under @ftrun.resilient
  // A rank of this node left a generation that had a process group: every
  // start says so (`rendezvous`), and a rank other than 0 then waits until
  // the new store listens before it connects (torch 1.13 retries a refused
  // connection only after a second).
  bool rendezvous_ = false;
  bool released_ = false;
  int failed_standbys_ = 0;  // in a row, exited before their hello: stop starting them at 3
  std::function<void()> left_;
  Clock::Time abort_deadline_;
  int generation_ = -1;  // the running one's
  int aborting_generation_ = -1;
  Resumed resumed_;
};

}  // namespace ftrun
