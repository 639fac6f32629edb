// Process supervision: starts processes (a node's ranks and standbys, the
// runner's local agents and rendezvous store) each leading its own process
// group, so a stop reaches its whole process tree; the agent is a child
// subreaper, so orphaned grandchildren are reaped too.
//
// Not thread-safe: used from one event loop (the agent's, the runner's).
// Reaping is driven by the caller (SIGCHLD via signalfd), which passes each
// reaped pid back.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

struct SpawnSpec {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "KEY=VALUE", the whole environment
  std::string log_file;          // empty: inherit the agent's stdout/stderr
  int stderr_fd = -1;            // without log_file: the child's stderr (else the agent's)
  int stdout_fd = -1;            // without log_file: the child's stdout (else the agent's)
  int stdin_fd = -1;             // the child's stdin (else the agent's)
  bool die_with_parent = true;   // PR_SET_PDEATHSIG SIGKILL (ranks); the runner's agents outlive it
};

// How a process ended, as waitpid reported it.
struct ExitInfo {
  bool signaled = false;
  int code = 0;  // exit status, or signal number when signaled
  // 0 for success, the exit code, or 128 + signal.
  int ShellCode() const { return signaled ? 128 + code : code; }
  std::string Describe() const;
};

// Forks and execs spec; the child gets its own process group and dies with
// the agent (PR_SET_PDEATHSIG). An exec failure shows as exit code 127.
Status SpawnProcess(const SpawnSpec& spec, pid_t* pid);

// Sends sig to the process group led by pgid (and SIGCONT after it, so a
// stopped rank can act on SIGTERM). ESRCH is not an error.
void SignalGroup(pid_t pgid, int sig);

// Makes this process a child subreaper (orphans of ranks are reparented here).
Status BecomeSubreaper();

// Reaps any exited child without blocking. Returns false when none is left.
bool ReapOne(pid_t* pid, ExitInfo* info);

}  // namespace ftrun
