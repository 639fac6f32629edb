// Retention: deleting old versions and unreferenced chunks.
#include "plugin/persist/retention.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/version_scan.h"

namespace ftrun {
namespace {

// Markers first, made durable, then the rest: a version is never complete
// with files missing.
Status DeleteVersion(Env* env, const std::string& vdir) {
  std::vector<std::string> names;
  FTRUN_RETURN_IF_ERROR(env->ListDir(vdir, &names));
  int node = 0;
  for (const auto& n : names) {
    if (ParseNodeMarkerName(n, &node)) FTRUN_RETURN_IF_ERROR(env->DeleteFile(vdir + "/" + n));
  }
  FTRUN_RETURN_IF_ERROR(env->SyncDir(vdir));
  return DeleteTree(env, vdir);
}

// Adds the chunks named by every manifest file in `vdir` to *live.
Status CollectLive(Env* env, const std::string& vdir, std::unordered_set<ChunkHash, ChunkHashHasher>* live) {
  std::vector<std::string> names;
  FTRUN_RETURN_IF_ERROR(env->ListDir(vdir, &names));
  for (const auto& n : names) {
    int rank = 0;
    if (!ParseManifestFileName(n, &rank)) continue;
    std::string bytes;
    ManifestFile f;
    FTRUN_RETURN_IF_ERROR(env->ReadFile(vdir + "/" + n, &bytes));
    FTRUN_RETURN_IF_ERROR(DecodeManifestFile(bytes, vdir + "/" + n, &f));
    for (const auto& t : f.manifest.tensors) {
      for (const auto& c : t.chunks) live->insert(c.hash);
    }
  }
  return Status::Ok();
}

// The live set: every chunk named by a manifest in a version directory
// there now. *skipped says why when a manifest could not be read.
Status LiveSet(Env* env, const std::string& job_dir, std::unordered_set<ChunkHash, ChunkHashHasher>* live,
               std::string* skipped) {
  std::vector<uint64_t> versions;
  FTRUN_RETURN_IF_ERROR(ListVersions(env, job_dir, &versions));
  for (uint64_t v : versions) {
    Status st = CollectLive(env, VersionDir(job_dir, v), live);
    if (!st.ok() && st.code() != Code::kNotFound) {  // a directory deleted meanwhile is fine
      *skipped = "version " + std::to_string(v) + ": " + st.message();
      return Status::Ok();
    }
  }
  return Status::Ok();
}

// Two phases, so that a writer on another node never loses a chunk it
// found on disk and skipped (retention.h): dead chunks are first set aside
// (renamed to <hash>.gc, which readers still find), then the live set is
// read again, from scratch, and each set-aside chunk that a manifest names
// now is renamed back; only the others are deleted.
Status CollectChunks(Env* env, const std::string& job_dir, int node, RetentionResult* result) {
  std::unordered_set<ChunkHash, ChunkHashHasher> live;
  FTRUN_RETURN_IF_ERROR(LiveSet(env, job_dir, &live, &result->gc_skipped));
  if (!result->gc_skipped.empty()) return Status::Ok();
  const std::string chunks = ChunksDir(job_dir);
  std::vector<std::string> subdirs;
  Status st = env->ListDir(chunks, &subdirs);
  if (st.code() == Code::kNotFound) return Status::Ok();
  FTRUN_RETURN_IF_ERROR(st);
  std::vector<std::pair<ChunkHash, std::string>> aside;  // hash, path of its .gc file
  for (const auto& sub : subdirs) {
    std::vector<std::string> names;
    bool is_dir = false;
    if (!env->IsDirectory(chunks + "/" + sub, &is_dir).ok() || !is_dir) continue;
    FTRUN_RETURN_IF_ERROR(env->ListDir(chunks + "/" + sub, &names));
    for (const auto& n : names) {
      const std::string path = chunks + "/" + sub + "/" + n;
      ChunkHash h;
      int tmp_node = -1;
      if (IsTmpName(n, &tmp_node)) {
        if (tmp_node != node) continue;
        uint64_t size = 0;
        (void)env->GetFileSize(path, &size);
        FTRUN_RETURN_IF_ERROR(env->DeleteFile(path));
        result->bytes_freed += size;
      } else if (ParseChunkFileName(n, &h) && !live.count(h)) {
        FTRUN_RETURN_IF_ERROR(env->RenameFile(path, GcName(path)));
        aside.push_back({h, GcName(path)});
      } else if (ParseGcChunkFileName(n, &h)) {
        aside.push_back({h, path});  // left by a run that stopped half-way
      }
    }
  }
  if (aside.empty()) return Status::Ok();
  // Whatever a writer put down meanwhile is in this scan.
  std::unordered_set<ChunkHash, ChunkHashHasher> now_live;
  std::string skipped;
  FTRUN_RETURN_IF_ERROR(LiveSet(env, job_dir, &now_live, &skipped));
  for (const auto& [hash, gc] : aside) {
    const std::string path = gc.substr(0, gc.size() - 3);
    if (!skipped.empty() || now_live.count(hash)) {
      // Live again (or unknown): back under its name, unless a writer wrote
      // it anew meanwhile.
      bool exists = env->FileExists(path);
      FTRUN_RETURN_IF_ERROR(exists ? env->DeleteFile(gc) : env->RenameFile(gc, path));
      ++result->chunks_kept;
      continue;
    }
    uint64_t size = 0;
    (void)env->GetFileSize(gc, &size);
    FTRUN_RETURN_IF_ERROR(env->DeleteFile(gc));
    result->bytes_freed += size;
    ++result->chunks_deleted;
  }
  return Status::Ok();
}

}  // namespace

Status ApplyRetention(const RetentionOptions& o, RetentionResult* result) {
  *result = RetentionResult();
  if (o.keep < 1) {
    return Status::InvalidArgument("persist retention: keep must be >= 1, got " + std::to_string(o.keep));
  }
  Env* env = o.env != nullptr ? o.env : PosixEnv();
  const std::string job_dir = PersistJobDir(o.dir, o.job_id);
  std::vector<uint64_t> versions;
  FTRUN_RETURN_IF_ERROR(ListVersions(env, job_dir, &versions));

  std::vector<uint64_t> complete;  // newest first
  std::set<uint64_t> incomplete;
  std::set<uint64_t> unread;  // a transient read error: kept until a scan can tell
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    VersionScan scan = ScanVersion(env, job_dir, *it);
    if (scan.complete) {
      complete.push_back(*it);
    } else if (scan.transient) {
      unread.insert(*it);
    } else {
      incomplete.insert(*it);
    }
  }
  if (complete.empty()) return Status::Ok();  // nothing newer is complete: delete nothing

  std::set<uint64_t> keep(complete.begin(), complete.begin() + std::min<size_t>(complete.size(), o.keep));
  if (o.protect) keep.insert(*o.protect);
  for (uint64_t v : complete) {
    if (keep.count(v)) result->kept.push_back(v);
  }
  const uint64_t newest = complete.front();
  for (uint64_t v : versions) {
    bool abandoned = incomplete.count(v) && v < newest;
    bool old = !incomplete.count(v) && !keep.count(v);
    if ((abandoned || old) && !keep.count(v) && !unread.count(v)) {
      FTRUN_RETURN_IF_ERROR(DeleteVersion(env, VersionDir(job_dir, v)).Annotate("persist retention"));
      result->deleted.push_back(v);
    }
  }
  if (!result->deleted.empty()) FTRUN_RETURN_IF_ERROR(env->SyncDir(job_dir));
  return CollectChunks(env, job_dir, o.node, result).Annotate("persist retention");
}

Status DiscardVersionsAbove(const RetentionOptions& o, uint64_t version, std::vector<uint64_t>* deleted) {
  Env* env = o.env != nullptr ? o.env : PosixEnv();
  const std::string job_dir = PersistJobDir(o.dir, o.job_id);
  std::vector<uint64_t> versions;
  FTRUN_RETURN_IF_ERROR(ListVersions(env, job_dir, &versions));
  bool any = false;
  for (uint64_t v : versions) {
    if (v <= version) continue;
    FTRUN_RETURN_IF_ERROR(DeleteVersion(env, VersionDir(job_dir, v))
                              .Annotate("persist: discarding versions above " + std::to_string(version)));
    if (deleted != nullptr) deleted->push_back(v);
    any = true;
  }
  return any ? env->SyncDir(job_dir) : Status::Ok();
}

}  // namespace ftrun
