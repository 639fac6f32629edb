// Flusher: the agent's lazy persistence (issue 4; DESIGN.md save path step
// 6). The versions written are the committed ones that are multiples of
// persist.every_versions (every one when it is 0), so that every node of a
// cluster writes the same versions and each becomes complete on disk once
// all nodes' markers are there. The newest such version is pinned in the
// store as soon as it commits; it is written when the writer is idle and
// (with every_versions 0) persist.every_seconds have passed since the last
// write. A newer one replaces a pending one that was not started (so a slow
// disk skips versions, never queues them). This node's manifests go to a
// writer thread, which writes the chunks not on disk yet (PersistWriter,
// paced by persist.rate_limit) and the node's marker, then applies retention
// (node 0 only: on a shared directory one node deletes). The event loop
// learns the end through event_fd() and unpins.
//
// After a version is on disk, still pinned, the writer thread scrubs it
// (ChunkScrubber, scrub.h): the chunk files it shares with older versions
// are read back once, and a bad one is rewritten from the RAM copy, so that
// a chunk that rotted on disk does not make every newer version that reuses
// it unrestorable. A repair that fails counts as a failed write (retried).
//
// Training never waits for it. A failing disk (ENOSPC, EIO) is logged, shown
// in the status, and retried with a backoff (1 s doubling to 60 s); RAM is
// untouched, so nothing committed is lost because the disk failed.
//
// Drain (at the job's end or on SIGTERM) writes the last committed version
// if it is not on disk yet, waiting up to a bound; it stops scrubs, which
// can wait for the next start.
//
// Threads: everything but the writer thread's body runs on the agent's
// event loop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "plugin/common/clock.h"
#include "plugin/common/fd.h"
#include "plugin/config/config.h"
#include "plugin/persist/env.h"
#include "plugin/persist/persist_writer.h"
#include "plugin/persist/scrub.h"
#include "plugin/store/snapshot_store.h"

namespace ftrun {

class Flusher {
 public:
  // Decisions (when a write is due, a backoff's end) read the Clock seam;
  // the real waits of Drain and Rewind, and the durations the log reports,
  // read the steady clock.
  using Wall = std::chrono::steady_clock;

  struct Options {
    PersistConfig config;
    std::string job_id;
    int world_size = 0;
    int node = 0;                             // names the marker; node 0 applies retention
    const char* arena_base = nullptr;         // chunk offsets are relative to it
    std::function<std::vector<int>()> ranks;  // this node's ranks, asked at each write
    Env* env = nullptr;                       // nullptr: a PosixEnv with persist.direct_io
    std::function<Status()> marker_guard;     // PersistWriterOptions::marker_guard (on the writer thread)
    const Clock* clock = &Clock::Steady();    // the agent's (its tests': a ManualClock)
  };

  Flusher(Options o, SnapshotStore* store);
  ~Flusher();  // cancels a write in progress and joins the thread

  Status Start();
  int event_fd() const { return event_.get(); }

  // A version committed in `epoch` (its timeline, which its markers record);
  // nullopt when this agent does not know the epoch it was committed in (a
  // restore point learned from the coordinator's pull or start): then it is
  // remembered as committed but never written by this agent.
  void OnCommitted(uint64_t version, std::optional<uint64_t> epoch, Clock::Time now);
  // The writer thread finished (event_fd readable).
  void OnEvent(Clock::Time now);
  // Timer: time-based writes and retries.
  void Tick(Clock::Time now);
  // Writes the last committed version if it is not on disk yet, waiting up
  // to `bound`; on timeout cancels. Returns the version on disk after it.
  std::optional<uint64_t> Drain(std::chrono::milliseconds bound);
  // The job goes back to `version` (restored from disk): stops a write in
  // progress (waiting up to 10 s for the thread), forgets newer commits. A
  // write that outlives the wait can never write its marker, and its end is
  // discarded (last_written never takes its version).
  void Rewind(uint64_t version);

  // Where the node's node is ("persist" in the agent's status JSON).
  nlohmann::json StatusJson() const;
  std::optional<uint64_t> last_written() const { return last_written_; }

 private:
  struct Job {
    uint64_t version = 0;
    uint64_t epoch = 0;
    uint64_t generation = 0;  // the writer's, when the write was decided
    std::vector<Manifest> manifests;
  };
  struct Done {
    uint64_t version = 0;
    uint64_t epoch = 0;
    uint64_t generation = 0;
    Status status;
    PersistProgress progress;  // of this write
    std::chrono::nanoseconds took{0};
    std::string retention;  // what retention did, for the log
    std::string scrub;      // what the scrub did, for the log
  };

  void MaybeStart(Clock::Time now, bool ignore_backoff);
  void SetPending(uint64_t version, uint64_t epoch);  // pins it; unpins the one it replaces
  void ThreadMain();
  Status ScrubWritten(uint64_t version, const std::vector<const Manifest*>& manifests, const ChunkSource& source,
                      std::string* note);
  std::string RunRetention(uint64_t protect);

  Options o_;
  SnapshotStore* store_;
  std::unique_ptr<Env> own_env_;
  Env* env_ = nullptr;
  std::unique_ptr<PersistWriter> writer_;
  std::unique_ptr<ChunkScrubber> scrubber_;  // checks writer_'s versions
  UniqueFd event_;
  std::thread thread_;

  // Event loop state.
  std::optional<uint64_t> committed_;        // newest committed version
  std::optional<uint64_t> committed_epoch_;  // its epoch, when known
  uint64_t pending_epoch_ = 0;               // of pending_
  std::optional<uint64_t> last_written_;     // newest version this node wrote
  std::optional<uint64_t> writing_;          // pinned, with the thread
  std::optional<uint64_t> pending_;          // pinned, next to write
  bool paused_ = false;                      // Rewind waits for the thread
  Clock::Time last_write_time_;
  Clock::Time backoff_until_;
  int failures_ = 0;  // in a row
  std::string last_error_;
  // What it has written, for the status.
  struct Totals {
    uint64_t bytes_written = 0, chunk_bytes_skipped = 0, versions_written = 0;
    double last_rate_mb_s = 0;
  } totals_;

  // Shared with the thread, guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> job_;
  std::optional<Done> done_;
  bool quit_ = false;
};

}  // namespace ftrun
