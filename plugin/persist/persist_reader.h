// PersistReader: what a job can restore from its persist directory. It lists
// the complete versions (incomplete ones are skipped with the reason), loads
// a version's manifests after checking that it belongs to this job, world
// size and tensor layout, reads chunks checking their hash, and picks the
// newest version that verifies, falling back to older ones.
//
// A reader never returns bytes it could not verify: every chunk read is
// checked against its hash, and every manifest against its marker.
// Reads that fail transiently (disk_errors.h: EIO, ESTALE, ...) are retried
// with a bounded backoff (LoadVersion, ReadChunk), so call those off any
// event loop. Thread-safe as its Env is; holds no state besides its
// arguments.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ftrun/status.h"
#include "plugin/persist/disk_errors.h"
#include "plugin/persist/env.h"
#include "plugin/persist/version_scan.h"
#include "plugin/store/manifest.h"

namespace ftrun {

class PersistReader {
 public:
  // dir: the persist root; job_id and world_size: this job's. env nullptr =
  // PosixEnv().
  PersistReader(Env* env, std::string dir, std::string job_id, int world_size);

  // Every version directory of the job, newest first, complete or not.
  Status Scan(std::vector<VersionScan>* out) const;
  // The complete versions, newest first. *skipped (if given) gets one line
  // per incomplete version: "version N: <reason>".
  Status ListComplete(std::vector<uint64_t>* versions, std::vector<std::string>* skipped = nullptr) const;

  // The manifests of complete `version`, in rank order. kFailedPrecondition
  // when it was written by another job or world size, or, with `expected`
  // (rank -> a manifest with the layout this job saves), when a rank's
  // tensors differ; the message names the difference. kNotFound when the
  // version is not complete on disk (with the reason).
  Status LoadVersion(uint64_t version, const std::map<int, Manifest>* expected, std::vector<Manifest>* out) const;

  // Reads ref.length bytes of chunk ref.hash into dst. kCorruption naming
  // the file when its header, size or hash is wrong (dst then holds garbage:
  // never use it); kNotFound when the file is missing. A restore reads from
  // disk only the chunks no RAM copy holds, so these errors also say that
  // the chunk had no RAM holder to repair it from (the fallback to an older
  // version is logged with this message). kIoTransient when the read failed
  // transiently on every try (retry_policy()).
  Status ReadChunk(const ChunkRef& ref, void* dst) const;
  // The same read and checks, with errors about the file only: for the
  // flusher's scrub (scrub.h), which does hold the chunk in RAM.
  Status CheckChunkFile(const ChunkRef& ref, void* dst) const;

  // Reads every chunk of complete `version` once and checks its hash.
  Status Verify(uint64_t version, uint64_t* chunks_checked = nullptr) const;

  // The newest complete version that is this job's, has the expected layout
  // (if given) and whose chunks all verify; a version that fails to verify
  // is skipped for the next older one (*skipped says why). A version of
  // another job, world size or layout is an error, not skipped: an older
  // one would not fit either. kNotFound when nothing is left.
  Status FindRestorable(const std::map<int, Manifest>* expected, uint64_t* version,
                        std::vector<std::string>* skipped = nullptr) const;

  const std::string& job_dir() const { return job_dir_; }
  void set_retry_policy(const RetryPolicy& p) { retry_ = p; }
  const RetryPolicy& retry_policy() const { return retry_; }

 private:
  Status ScanRetrying(uint64_t version, VersionScan* s) const;
  Status CheckJob(const VersionScan& scan, const std::map<int, Manifest>* expected) const;
  Status NoVersions() const;

  Env* const env_;
  const std::string dir_;
  const std::string job_id_;
  const int world_size_;
  const std::string job_dir_;
  RetryPolicy retry_;
};

}  // namespace ftrun
