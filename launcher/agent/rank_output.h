// RankOutput: the ranks' stdout and stderr, passed through to the
// agent's own, a line at a time, and the last lines of each rank's stderr
// kept, so that an error can quote what a rank said before it died (a
// traceback, an argparse message).
//
// Ranks write their output unbuffered (PYTHONUNBUFFERED=1: nothing is lost
// when one dies), so print() writes a line's text and its line break
// separately, and two ranks printing at once would interleave inside a
// line. Each pipe's bytes are forwarded up to their last line break ('\n',
// or '\r' for a progress bar) in one write; the rest waits for its line
// break, at most kHoldFor (then it goes as it is: a prompt, a partial
// line), or until kHoldBytes are held. With `prefix`, every line starts
// with "[rank N]: " (torchrun's --tee log-line prefix).
//
// One thread forwards every rank's pipe (epoll), so a slow reader of the
// agent's output never stalls the agent's event loop; a rank writing faster
// than that reader blocks on its own pipe, as it would on an inherited one.
//
// Thread-safe. The destructor forwards what is waiting in the pipes, then
// stops the thread; pipes still open then are closed (a rank that writes after that gets EPIPE/SIGPIPE, as with a
// closed terminal).
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

class RankOutput {
 public:
  static constexpr auto kHoldFor = std::chrono::milliseconds(100);
  static constexpr size_t kHoldBytes = 65536;

  // `out`, `err`: where a rank's stdout and stderr go (the agent's); not owned.
  RankOutput(int out, int err, bool prefix = false);
  ~RankOutput();
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  Status Start();

  // New pipes for `rank`'s stdout and stderr; the write ends are for the
  // child (the caller closes its copies once the child has them). Tail(rank)
  // follows the new stderr pipe from now on; older ones are still forwarded
  // until their EOF.
  Status NewPipes(int rank, UniqueFd* stdout_write, UniqueFd* stderr_write);

  // The last `max_lines` lines of the rank's current pipe, after taking
  // what is waiting in it (bytes a rank wrote just before it died).
  std::string Tail(int rank, size_t max_lines);

 private:
  struct Pipe {
    int rank = 0;
    int sink = -1;
    bool keep_tail = false;  // stderr
    UniqueFd fd;
    std::string held;  // after the last line break forwarded
    std::chrono::steady_clock::time_point held_since;
    std::string tail;  // stderr: the last kTailBytes bytes
  };
  static constexpr size_t kTailBytes = 8192;

  Status AddPipe(int rank, int sink, bool keep_tail, UniqueFd* write_end);
  void Run();
  // Reads what is waiting on `fd` (without blocking), forwards its whole
  // lines and keeps its tail. Returns false at EOF or on an error. Requires mu_.
  bool DrainLocked(Pipe& p);
  // Forwards `p.held` up to its last line break (`all`: every byte).
  // Requires mu_.
  void ForwardLocked(Pipe& p, bool all);
  // How long epoll may wait: until the oldest held partial line is due.
  int WaitMsLocked() const;

  // Constant after construction.
  const int out_, err_;
  const bool prefix_;
  UniqueFd epoll_, wake_;

  std::mutex mu_;
  // Guarded by mu_.
  std::map<int, Pipe> pipes_;   // by read fd
  std::map<int, int> current_;  // rank -> read fd of its newest pipe
  bool stop_ = false;

  std::thread thread_;
};

// Where a rank's own log file is with --enable_each_rank_log DIR.
std::string RankLogPath(const std::string& dir, int rank);
// The last `max_lines` lines of `text` (a trailing line break does not count).
std::string LastLines(const std::string& text, size_t max_lines);
// The last `max_lines` lines of the file at `path` (its last 4 KiB at most;
// "" when it cannot be read; never through a link).
std::string FileTail(const std::string& path, size_t max_lines);

}  // namespace ftrun
