// Retention: keeps the newest `keep` complete versions of a job on disk, and
// the version the job would restore from, and deletes the rest once a newer
// version is complete; then deletes chunk files that no remaining version
// references.
//
// What goes:
//  - complete versions older than the newest `keep` complete ones, except
//    `protect`;
//  - incomplete versions older than the newest complete one (abandoned by a
//    crash or a cancelled write). Incomplete versions newer than it stay: a
//    writer may be busy with them.
// Nothing goes while no version is complete. A version is deleted marker
// first, then the directory is synced, then the rest: a crash half-way
// leaves an incomplete version, never a complete one with files missing.
//
// Chunks: the live set is every chunk named by a manifest file in any
// remaining version directory, complete or not (writers put manifests down
// before chunks, so a version being written keeps its chunks). If a manifest
// cannot be read the collection is skipped rather than risk a live chunk.
// This node's own *.tmp files are removed too.
//
// The race with another node's writer (a shared directory): the live set is
// read at some instant; a writer whose manifest appears just after it may
// find a dead chunk still there and skip writing it. So a dead chunk is not
// deleted at once: it is renamed to <hash>.gc (set aside; readers fall back
// to that name, persist_reader.h), then the live set is read again from
// scratch, and a set-aside chunk that some manifest names now is renamed
// back; only the rest is deleted. A writer that skipped a chunk had its
// manifest durable before it looked (manifests go first), so before the
// rename, so before the second scan, which therefore sees the chunk live.
// No clocks, no waits. A run that stops half-way leaves .gc files, which
// the next run treats the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ftrun/status.h"
#include "plugin/persist/env.h"

namespace ftrun {

struct RetentionOptions {
  std::string dir;  // persist root
  std::string job_id;
  int keep = 2;                     // persist.keep: complete versions kept, >= 1
  std::optional<uint64_t> protect;  // never deleted: the version the job would restore from
  int node = 0;                     // whose *.tmp files to remove
  Env* env = nullptr;               // nullptr = PosixEnv()
};

struct RetentionResult {
  std::vector<uint64_t> kept;     // complete versions kept, newest first
  std::vector<uint64_t> deleted;  // version directories deleted, oldest first
  uint64_t chunks_deleted = 0;
  uint64_t bytes_freed = 0;  // chunk and tmp files
  std::string gc_skipped;    // why chunks were not collected; "" when they were
  uint64_t chunks_kept = 0;  // set aside as dead, then found live again (a writer meanwhile)
};

Status ApplyRetention(const RetentionOptions& options, RetentionResult* result);

// Deletes every version above `version` (markers first), complete or not:
// after a job restores `version`, the versions above it on disk belong to a
// timeline that no longer exists, and new saves will reuse their numbers.
// Uses dir, job_id and env of `options`; *deleted (if given) lists them,
// oldest first. Their chunks go at the next ApplyRetention.
Status DiscardVersionsAbove(const RetentionOptions& options, uint64_t version, std::vector<uint64_t>* deleted);

}  // namespace ftrun
