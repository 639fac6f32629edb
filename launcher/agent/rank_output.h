// RankOutput: the ranks' stderr, passed through to the agent's own stderr
// and its last lines kept per rank, so that an error can quote what a rank
// said before it died (a traceback, an argparse message).
//
// One thread forwards every rank's pipe (epoll), so a slow reader of the
// agent's stderr never stalls the agent's event loop; a rank writing faster
// than that reader blocks on its own pipe, as it would on an inherited one.
//
// Thread-safe. The destructor stops the thread; pipes still open then are
// closed (a rank that writes after that gets EPIPE/SIGPIPE, as with a
// closed terminal).
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

class RankOutput {
 public:
  // `sink`: where the bytes go (the agent's stderr); not owned.
  explicit RankOutput(int sink);
  ~RankOutput();
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  Status Start();

  // A new pipe for `rank`'s stderr; `write_end` is for the child (the
  // caller closes its copy once the child has it). Tail(rank) follows the
  // new pipe from now on; an older one is still forwarded until its EOF.
  Status NewPipe(int rank, UniqueFd* write_end);

  // The last `max_lines` lines of the rank's current pipe, after taking
  // what is waiting in it (bytes a rank wrote just before it died).
  std::string Tail(int rank, size_t max_lines);

 private:
  struct Pipe {
    int rank = 0;
    UniqueFd fd;
    std::string tail;  // the last kTailBytes bytes
  };
  static constexpr size_t kTailBytes = 8192;

  void Run();
  // Reads what is waiting on `fd` (without blocking), forwards it and keeps
  // its tail. Returns false at EOF or on an error. Requires mu_.
  bool DrainLocked(Pipe& p);

  // Constant after construction.
  const int sink_;
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
