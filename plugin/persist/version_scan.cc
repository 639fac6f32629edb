// Completeness of a version on disk, judged from its markers and manifests.
#include "plugin/persist/version_scan.h"

#include <algorithm>
#include <map>

#include "plugin/common/file.h"

namespace ftrun {
namespace {

constexpr int kMaxWorldSize = 1 << 24;

VersionScan Incomplete(VersionScan s, std::string reason) {
  s.complete = false;
  s.reason = std::move(reason);
  s.manifests.clear();
  return s;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return s;
}

}  // namespace

Status ListVersions(Env* env, const std::string& job_dir, std::vector<uint64_t>* versions) {
  versions->clear();
  std::vector<std::string> names;
  Status st = env->ListDir(job_dir, &names);
  if (st.code() == Code::kNotFound) return Status::Ok();
  FTRUN_RETURN_IF_ERROR(st);
  for (const auto& n : names) {
    uint64_t v = 0;
    if (ParseVersionDirName(n, &v)) versions->push_back(v);
  }
  std::sort(versions->begin(), versions->end());
  return Status::Ok();
}

VersionScan ScanVersion(Env* env, const std::string& job_dir, uint64_t version) {
  VersionScan s;
  s.version = version;
  s.dir = VersionDir(job_dir, version);
  std::vector<std::string> names;
  Status st = env->ListDir(s.dir, &names);
  s.transient = st.code() == Code::kIoTransient;
  if (!st.ok()) return Incomplete(s, st.message());
  std::sort(names.begin(), names.end());

  // Markers: every readable one must agree on job, world size and version.
  std::vector<NodeMarker> markers;
  std::string first_problem, first_name;
  for (const auto& n : names) {
    int node = 0;
    if (!ParseNodeMarkerName(n, &node)) continue;
    std::string bytes;
    NodeMarker m;
    st = env->ReadFile(s.dir + "/" + n, &bytes);
    s.transient |= st.code() == Code::kIoTransient;
    if (st.ok()) st = DecodeNodeMarker(bytes, s.dir + "/" + n, &m);
    if (!st.ok()) {
      if (first_problem.empty()) first_problem = st.message();
      continue;
    }
    if (m.version != version) {
      return Incomplete(s, "marker '" + s.dir + "/" + n + "' is for version " + std::to_string(m.version));
    }
    if (markers.empty()) {
      s.job_id = m.job_id;
      s.world_size = m.world_size;
      first_name = n;
    } else if (m.job_id != s.job_id || m.world_size != s.world_size) {
      return Incomplete(s, "markers in '" + s.dir + "' disagree: " + first_name + " says job '" + s.job_id +
                               "' with world size " + std::to_string(s.world_size) + ", " + n + " says job '" +
                               m.job_id + "' with world size " + std::to_string(m.world_size));
    } else if (m.has_epoch != markers.front().has_epoch || m.epoch != markers.front().epoch) {
      // Two timelines: one node's files of this version number were written
      // before the job went back below it, another's after. Never complete.
      s.mixed_epochs = true;
      return Incomplete(s, "markers of version " + std::to_string(version) + " disagree on its timeline: '" + s.dir +
                               "/" + first_name + "' has " + MarkerEpochString(markers.front()) + ", '" + s.dir + "/" +
                               n + "' has " + MarkerEpochString(m) + " (a version mixed from two timelines; refused)");
    }
    markers.push_back(std::move(m));
  }
  if (markers.empty()) {
    return Incomplete(s,
                      first_problem.empty() ? "'" + s.dir + "' has no COMPLETE marker (not finished)" : first_problem);
  }
  if (s.world_size <= 0 || s.world_size > kMaxWorldSize) {
    return Incomplete(s, "markers in '" + s.dir + "' give world size " + std::to_string(s.world_size));
  }

  // Coverage: rank -> the (size, checksum) pairs markers recorded for it.
  std::map<int, std::vector<const NodeMarker::Rank*>> cover;
  for (const auto& m : markers) {
    for (const auto& r : m.ranks) {
      if (r.rank < 0 || r.rank >= s.world_size) {
        return Incomplete(s, "a marker in '" + s.dir + "' lists rank " + std::to_string(r.rank) + " of world size " +
                                 std::to_string(s.world_size));
      }
      cover[r.rank].push_back(&r);
    }
  }
  std::vector<int> missing;
  for (int r = 0; r < s.world_size; ++r) {
    if (!cover.count(r)) missing.push_back(r);
  }
  if (!missing.empty()) {
    return Incomplete(s, "'" + s.dir + "': no COMPLETE marker covers rank" + (missing.size() > 1 ? "s " : " ") +
                             RankList(missing) + " yet (of world size " + std::to_string(s.world_size) + ")");
  }

  // Every rank's manifest must be the one its marker recorded.
  for (int r = 0; r < s.world_size; ++r) {
    const std::string path = s.dir + "/" + ManifestFileName(r);
    std::string bytes;
    st = env->ReadFile(path, &bytes);
    s.transient |= st.code() == Code::kIoTransient;
    if (!st.ok()) return Incomplete(s, st.message());
    ChunkHash sum = FileChecksum(bytes);
    bool matches = std::any_of(cover[r].begin(), cover[r].end(), [&](const NodeMarker::Rank* e) {
      return e->manifest_size == bytes.size() && e->manifest_checksum == sum;
    });
    if (!matches) {
      return Incomplete(s, "manifest '" + path + "' (" + std::to_string(bytes.size()) +
                               " bytes) does not match its COMPLETE marker (torn, corrupted or overwritten)");
    }
    ManifestFile f;
    st = DecodeManifestFile(bytes, path, &f);
    if (!st.ok()) return Incomplete(s, st.message());
    if (f.job_id != s.job_id || f.world_size != s.world_size || f.manifest.rank != r || f.manifest.version != version) {
      return Incomplete(s, "manifest '" + path + "' is for job '" + f.job_id + "' world size " +
                               std::to_string(f.world_size) + " rank " + std::to_string(f.manifest.rank) + " version " +
                               std::to_string(f.manifest.version) + ", its marker for job '" + s.job_id +
                               "' world size " + std::to_string(s.world_size));
    }
    s.manifests.push_back(std::move(f));
  }
  s.epoch = markers.front().epoch;
  s.has_epoch = markers.front().has_epoch;
  s.complete = true;
  return s;
}

Status FindCompleteVersion(Env* env, const std::string& dir, const std::string& job, std::optional<uint64_t> want,
                           VersionScan* out) {
  std::vector<std::string> jobs;
  if (!env->ListDir(dir, &jobs).ok()) {
    return Status::NotFound("persist dir '" + dir + "' does not exist or is not a directory (expected the " +
                            "persist.dir the job ran with)");
  }
  const std::string job_dir = PersistJobDir(dir, job);
  if (std::find(jobs.begin(), jobs.end(), job) == jobs.end()) {
    std::sort(jobs.begin(), jobs.end());
    return Status::NotFound("persist dir '" + dir + "' has no job '" + job + "' (no directory '" + job_dir +
                            "'; jobs there: " + NameListing(jobs) + ")");
  }
  std::vector<uint64_t> versions;
  FTRUN_RETURN_IF_ERROR(ListVersions(env, job_dir, &versions));
  if (want.has_value()) {
    if (!std::binary_search(versions.begin(), versions.end(), *want)) {
      std::vector<std::string> have;
      for (auto it = versions.rbegin(); it != versions.rend(); ++it) have.push_back(std::to_string(*it));
      return Status::NotFound("job '" + job + "' in persist dir '" + dir + "' has no version " + std::to_string(*want) +
                              " (no directory '" + VersionDir(job_dir, *want) +
                              "'; versions there, newest first: " + NameListing(have, false) + ")");
    }
    *out = ScanVersion(env, job_dir, *want);
    if (!out->complete) {
      return Status::FailedPrecondition("version " + std::to_string(*want) + " of job '" + job +
                                        "' is not complete: " + out->reason);
    }
    return Status::Ok();
  }
  std::string reasons;
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    *out = ScanVersion(env, job_dir, *it);
    if (out->complete) return Status::Ok();
    reasons += "; version " + std::to_string(*it) + ": " + out->reason;
  }
  return Status::NotFound("job '" + job + "' in persist dir '" + dir + "' has no complete version" +
                          (versions.empty() ? " (no version directory in '" + job_dir + "')" : reasons));
}

}  // namespace ftrun
