// DiskVersions: what the coordinator knows of the versions complete in the
// persist directory, for a job that must go back to one (started again
// after it was killed whole, more nodes lost than the replicas cover, a
// node that cannot read the version the job went back to).
//
// A scan runs off the coordinator's event loop (Coordinator::Options::
// scan_disk); one scan at a time serves the latest need (Ask), its answer
// (Scanned) is acted on once, and the next need scans again (the disk
// changes). Versions a node could not read are skipped (Bad). After the job
// went back to a version, the files above it are another timeline's: they
// are void once a newer version commits, never before (a transient failure
// must never cost a good version).
//
// Not thread-safe: owned by the coordinator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ftrun {

class DiskVersions {
 public:
  enum class Need { kNone, kStart, kCoverage, kOlder };

  // A scan is needed for `need`; true when one must be asked for now
  // (false: the answer already on its way serves this need too).
  bool Ask(Need need, std::string detail) {
    const bool ask = need_ == Need::kNone;
    need_ = need;
    detail_ = std::move(detail);
    return ask;
  }
  bool awaited() const { return need_ != Need::kNone; }
  // An answer came: the need it serves (kNone: none was awaited).
  Need Answered() { return std::exchange(need_, Need::kNone); }
  // What it found, acted on until Done: the versions complete on disk,
  // newest first.
  void Use(std::vector<uint64_t> newest_first) { scan_ = std::move(newest_first); }
  void Done() { scan_.reset(); }  // the disk changes: the next need scans again
  bool scanned() const { return scan_.has_value(); }
  const std::string& detail() const { return detail_; }  // for the messages of what it decides

  // The newest version of the scan being acted on not known to be
  // unreadable, if any.
  std::optional<uint64_t> Newest() const {
    if (!scan_) return std::nullopt;
    for (uint64_t v : *scan_) {
      if (!bad_.count(v)) return v;
    }
    return std::nullopt;
  }
  void Bad(uint64_t version) { bad_.insert(version); }  // some node could not read its ranks of it

  // The job went back to `version`: what lies above it is void once a newer
  // version commits.
  void WentBackTo(uint64_t version) { void_above_ = void_above_ ? std::min(*void_above_, version) : version; }
  // `committed` was committed: the version above which every node drops
  // its files, when it is newer than the one the job went back to (once;
  // version numbers found bad there may be written again, good).
  std::optional<uint64_t> Committed(uint64_t committed) {
    if (!void_above_ || committed <= *void_above_) return std::nullopt;
    bad_.clear();
    return std::exchange(void_above_, std::nullopt);
  }

 private:
  Need need_ = Need::kNone;
  std::string detail_;
  std::optional<std::vector<uint64_t>> scan_;
  std::set<uint64_t> bad_;
  std::optional<uint64_t> void_above_;
};

}  // namespace ftrun
