// RankProcesses: the node's rank processes, one slot per local rank. Starts
// a generation of them, learns of their exits, stops them all (SIGTERM to
// each rank's process group, SIGKILL after job.stop_grace, then the groups
// drained: a stopped rank's children hold its rendezvous, GPU memory and
// the store mapping, so the next generation starts only once they are gone),
// and finds a rank that hangs (no progress for job.hang_timeout).
//
// A slot whose process is kept() (a survivor of warm recovery, leaving its
// generation or parked: warm_ranks.h) is left alone by Stop and the drain.
//
// It decides nothing about the job: what an exit means (a rank finished, a
// failure to report) is the agent's call. Time comes from a Clock (manual in
// tests); reaping is the caller's (SIGCHLD), which passes each pid to Exited.
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <set>
#include <vector>

#include "launcher/common/supervisor.h"
#include "plugin/common/clock.h"

namespace ftrun {

class RankProcesses {
 public:
  using Time = Clock::Time;

  struct Slot {
    int local_rank = 0;
    int global_rank = 0;
    pid_t pid = 0;          // the rank's process; 0 once it exited
    pid_t pgid = 0;         // its process group: may outlive it (its children)
    bool finished = false;  // exited 0
    uint64_t conn_id = 0;   // its live connection to the agent, 0 if none
    Time last_progress;
    Time connected, restored, first_step;  // this generation's, once each
    // Warm recovery (warm_ranks.h): kCold until the process says it runs
    // under @ftrun.resilient over its control link (control_id).
    enum class Warm : uint8_t { kCold, kRunning, kAborting, kParked };
    Warm warm = Warm::kCold;
    uint64_t control_id = 0;
    // The sockets it had when this generation began, and those its leaving settled (release_connections.h).
    std::set<uint64_t> sockets_settled;
    bool kept() const { return pid != 0 && (warm == Warm::kAborting || warm == Warm::kParked); }
  };

  struct Options {
    std::chrono::milliseconds stop_grace{5000};
    std::chrono::milliseconds hang_timeout{0};     // 0: never hung
    std::chrono::milliseconds drain_bound{10000};  // groups that outlive it are killed on every tick after
  };

  RankProcesses(const Clock& clock, Options options) : clock_(clock), o_(options) {}

  // The node's ranks: first_rank .. first_rank + count - 1 (none running).
  void Assign(int first_rank, int count);
  std::vector<Slot>& slots() { return slots_; }
  const std::vector<Slot>& slots() const { return slots_; }
  Slot* ByRank(int global_rank);
  std::vector<int> Ranks() const;

  // Starts `slot`'s process of a new generation.
  Status Spawn(Slot& slot, const SpawnSpec& spec);
  // `slot` goes on in a new generation with the process `pid` (leading
  // group `pgid`): its own survivor, or a warm standby it adopts.
  void Reuse(Slot& slot, pid_t pid, pid_t pgid);
  // A reaped child: its slot (pid now 0), or nullptr for another process
  // (an orphaned grandchild). While stopping, the last rank's exit begins
  // the drain.
  Slot* Exited(pid_t pid);
  // Whether any rank process is alive.
  bool AnyAlive() const;
  // A finished rank's leftovers (a data-loader worker) go now.
  void KillFinishedGroup(Slot& slot);

  // Stops every rank but the kept ones (SIGTERM now, SIGKILL after stop_grace, see Tick);
  // `stopped` runs once every process and group is gone (on the call, on an
  // Exited or on a Tick). A second Stop while stopping changes nothing but
  // the callback.
  void Stop(std::function<void()> stopped);
  bool stopping() const { return stopping_; }

  // The first running rank with no progress for hang_timeout, if any. A
  // rank for which `waiting` is true (blocked on a commit) is not hung as
  // long as some other rank is still working towards it.
  Slot* Hung(const std::function<bool(const Slot&)>& waiting);

  // Escalates a stop past its grace, drains, kills stragglers.
  void Tick();

 private:
  void BeginDrain();
  void ContinueDrain();
  bool AnyToStopAlive() const;  // a process alive that is not kept

  const Clock& clock_;
  const Options o_;
  std::vector<Slot> slots_;
  bool stopping_ = false;
  bool killed_hard_ = false;
  bool draining_ = false;
  Time stop_deadline_, drain_deadline_;
  std::function<void()> stopped_;
  std::vector<pid_t> stragglers_;  // groups that outlived drain_bound
};

}  // namespace ftrun
