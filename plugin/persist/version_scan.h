// Which versions a persist directory holds and whether each is complete:
// its COMPLETE markers agree with each other (job, world size, epoch: one
// timeline) and with the directory name,
// and cover every rank 0..world_size-1 with a manifest file whose size and
// checksum are the ones the marker recorded. Shared by the reader (what can
// be restored), retention (what may be deleted) and the writer.
//
// Pure functions of what is on disk; thread-safe as the Env is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ftrun/status.h"
#include "plugin/persist/disk_format.h"
#include "plugin/persist/env.h"

namespace ftrun {

struct VersionScan {
  uint64_t version = 0;
  std::string dir;
  bool complete = false;
  std::string reason;                   // why it is not complete; "" when it is
  bool transient = false;               // a read failed transiently (kIoTransient): the reason may pass
  std::string job_id;                   // from the markers; "" when none could be read
  int world_size = 0;                   // from the markers
  std::vector<ManifestFile> manifests;  // every rank in order, when complete
  uint64_t epoch = 0;                   // the timeline all markers agree on, when complete
  bool has_epoch = false;               // false: format 1 markers (before epochs)
  bool mixed_epochs = false;            // refused: markers from two timelines (reason names both)
};

// The version directories under `job_dir`, ascending; other names are
// ignored. A missing job_dir gives an empty list.
Status ListVersions(Env* env, const std::string& job_dir, std::vector<uint64_t>* versions);

// Reads one version's markers and manifests. Any problem with them (missing,
// torn, corrupt, disagreeing, unreadable) makes complete false with a reason
// that names the file.
VersionScan ScanVersion(Env* env, const std::string& job_dir, uint64_t version);

// The version a reader of a persist directory takes (`ftrun export`,
// ftrun.read_persisted/load_persisted): `want` when given, which must be
// complete, else the newest complete one. Errors name the persist dir, the
// job and what is there instead: NotFound (no such dir, job or version, no
// complete version: every version's reason), FailedPrecondition (`want`
// is not complete).
Status FindCompleteVersion(Env* env, const std::string& dir, const std::string& job, std::optional<uint64_t> want,
                           VersionScan* out);

}  // namespace ftrun
