// PersistReader: listing, loading and verifying versions on disk.
#include "plugin/persist/persist_reader.h"

#include <algorithm>
#include <unordered_set>

#include "plugin/persist/disk_format.h"

namespace ftrun {

PersistReader::PersistReader(Env* env, std::string dir, std::string job_id, int world_size)
    : env_(env != nullptr ? env : PosixEnv()),
      dir_(std::move(dir)),
      job_id_(std::move(job_id)),
      world_size_(world_size),
      job_dir_(PersistJobDir(dir_, job_id_)) {}

Status PersistReader::Scan(std::vector<VersionScan>* out) const {
  std::vector<uint64_t> versions;
  FTRUN_RETURN_IF_ERROR(ListVersions(env_, job_dir_, &versions));
  out->clear();
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) out->push_back(ScanVersion(env_, job_dir_, *it));
  return Status::Ok();
}

Status PersistReader::ListComplete(std::vector<uint64_t>* versions, std::vector<std::string>* skipped) const {
  std::vector<VersionScan> scans;
  FTRUN_RETURN_IF_ERROR(Scan(&scans));
  versions->clear();
  for (const auto& s : scans) {
    if (s.complete) {
      versions->push_back(s.version);
    } else if (skipped != nullptr) {
      skipped->push_back("version " + std::to_string(s.version) + ": " + s.reason);
    }
  }
  return Status::Ok();
}

Status PersistReader::CheckJob(const VersionScan& s, const std::map<int, Manifest>* expected) const {
  const std::string where = "persist dir '" + dir_ + "': version " + std::to_string(s.version);
  if (s.job_id != job_id_ || s.world_size != world_size_) {
    return Status::FailedPrecondition(where + " was written by job '" + s.job_id + "' with world size " +
                                      std::to_string(s.world_size) + "; this job is '" + job_id_ +
                                      "' with world size " + std::to_string(world_size_));
  }
  if (expected == nullptr) return Status::Ok();
  for (const auto& [rank, want] : *expected) {
    if (rank < 0 || rank >= s.world_size) {
      return Status::InvalidArgument(where + ": no rank " + std::to_string(rank) + " in world size " +
                                     std::to_string(s.world_size));
    }
    Status st = CheckSameLayout(s.manifests[rank].manifest, want);
    if (!st.ok()) return st.Annotate(where + " has another tensor layout than this job");
  }
  return Status::Ok();
}

// A scan that failed on a transient read is tried again (disk_errors.h);
// kIoTransient when it still does.
Status PersistReader::ScanRetrying(uint64_t version, VersionScan* s) const {
  Status read = RetryTransient(retry_, "persist: reading version " + std::to_string(version), [&] {
    *s = ScanVersion(env_, job_dir_, version);
    return s->complete || !s->transient ? Status::Ok() : Status(Code::kIoTransient, s->reason);
  });
  if (read.ok()) return read;
  return Status(Code::kIoTransient, "persist dir '" + dir_ + "': version " + std::to_string(version) +
                                        " could not be read: " + read.message());
}

Status PersistReader::LoadVersion(uint64_t version, const std::map<int, Manifest>* expected,
                                  std::vector<Manifest>* out) const {
  VersionScan s;
  FTRUN_RETURN_IF_ERROR(ScanRetrying(version, &s));
  if (!s.complete) {
    return Status::NotFound("persist dir '" + dir_ + "': version " + std::to_string(version) +
                            " is not complete: " + s.reason);
  }
  FTRUN_RETURN_IF_ERROR(CheckJob(s, expected));
  out->clear();
  for (auto& f : s.manifests) out->push_back(std::move(f.manifest));
  return Status::Ok();
}

Status PersistReader::ReadChunk(const ChunkRef& ref, void* dst) const {
  Status st =
      RetryTransient(retry_, "persist: reading chunk " + ref.hash.ToHex(), [&] { return CheckChunkFile(ref, dst); });
  if (st.ok() || (st.code() != Code::kCorruption && st.code() != Code::kNotFound)) return st;
  return Status(st.code(), st.message() + "; the chunk had no RAM holder to repair it from");
}

Status PersistReader::CheckChunkFile(const ChunkRef& ref, void* dst) const {
  const std::string path = ChunkPath(job_dir_, ref.hash);
  std::unique_ptr<RandomAccessFile> f;
  Status st = env_->NewRandomAccessFile(path, &f);
  // Set aside by retention for a moment (retention.h): still the chunk.
  if (st.code() == Code::kNotFound && env_->NewRandomAccessFile(GcName(path), &f).ok()) st = Status::Ok();
  if (st.code() == Code::kNotFound)
    return Status::NotFound("chunk " + ref.hash.ToHex() + " is missing: " + st.message());
  FTRUN_RETURN_IF_ERROR(st);
  if (f->size() < kChunkHeaderSize || f->size() - kChunkHeaderSize != ref.length) {  // no wrap near 2^64
    return Status::Corruption("chunk file '" + path + "' is " + std::to_string(f->size()) + " bytes, expected " +
                              std::to_string(kChunkHeaderSize + ref.length) + " (header and " +
                              std::to_string(ref.length) + " bytes)");
  }
  std::string header(kChunkHeaderSize, '\0');
  size_t got = 0;
  FTRUN_RETURN_IF_ERROR(f->Read(0, header.size(), header.data(), &got));
  ChunkHash hash;
  uint64_t length = 0;
  FTRUN_RETURN_IF_ERROR(DecodeChunkHeader(header.data(), got, path, &hash, &length));
  if (hash != ref.hash || length != ref.length) {
    return Status::Corruption("chunk file '" + path + "' holds chunk " + hash.ToHex() + " of " +
                              std::to_string(length) + " bytes, expected " + ref.hash.ToHex() + " of " +
                              std::to_string(ref.length));
  }
  FTRUN_RETURN_IF_ERROR(f->Read(kChunkHeaderSize, ref.length, dst, &got));
  if (got != ref.length) {
    return Status::Corruption("chunk file '" + path + "' ended after " + std::to_string(got) + " of " +
                              std::to_string(ref.length) + " bytes");
  }
  ChunkHash actual = HashBytes(dst, ref.length);
  if (actual != ref.hash) {
    return Status::Corruption("chunk file '" + path + "': its bytes hash to " + actual.ToHex() + ", expected " +
                              ref.hash.ToHex() + " (corrupted on disk)");
  }
  return Status::Ok();
}

Status PersistReader::Verify(uint64_t version, uint64_t* chunks_checked) const {
  VersionScan s;
  FTRUN_RETURN_IF_ERROR(ScanRetrying(version, &s));
  if (!s.complete) {
    return Status::NotFound("persist dir '" + dir_ + "': version " + std::to_string(version) +
                            " is not complete: " + s.reason);
  }
  std::unordered_set<ChunkHash, ChunkHashHasher> seen;
  std::string buf;
  uint64_t n = 0;
  for (const auto& f : s.manifests) {
    for (const auto& t : f.manifest.tensors) {
      for (const auto& c : t.chunks) {
        if (!seen.insert(c.hash).second) continue;
        if (buf.size() < c.length) buf.resize(c.length);
        Status st = ReadChunk(c, buf.data());
        if (!st.ok()) {
          return st.Annotate("persist dir '" + dir_ + "': version " + std::to_string(version) + " rank " +
                             std::to_string(f.manifest.rank) + " tensor '" + t.info.name + "'");
        }
        ++n;
      }
    }
  }
  if (chunks_checked != nullptr) *chunks_checked = n;
  return Status::Ok();
}

Status PersistReader::NoVersions() const {
  std::vector<std::string> jobs;
  if (env_->ListDir(dir_, &jobs).ok()) {
    jobs.erase(std::remove(jobs.begin(), jobs.end(), job_id_), jobs.end());
    std::sort(jobs.begin(), jobs.end());
  }
  std::string others;
  for (const auto& j : jobs) others += (others.empty() ? "" : ", ") + ("'" + j + "'");
  return Status::NotFound("persist dir '" + dir_ + "' has no complete version of job '" + job_id_ + "'" +
                          (others.empty() ? std::string() : " (it holds other jobs: " + others + ")"));
}

Status PersistReader::FindRestorable(const std::map<int, Manifest>* expected, uint64_t* version,
                                     std::vector<std::string>* skipped) const {
  std::vector<VersionScan> scans;
  FTRUN_RETURN_IF_ERROR(Scan(&scans));
  std::string reasons;
  bool any_complete = false;
  for (const auto& s : scans) {
    std::string why;
    if (s.complete) {
      any_complete = true;
      FTRUN_RETURN_IF_ERROR(CheckJob(s, expected));
      Status st = Verify(s.version);
      if (st.ok()) {
        *version = s.version;
        return Status::Ok();
      }
      if (ClassifyDiskError(st) != DiskErrorClass::kVersionBad) return st;  // an older one is no answer
      why = st.message();
    } else {
      why = s.reason;
    }
    std::string line = "version " + std::to_string(s.version) + ": " + why;
    if (skipped != nullptr) skipped->push_back(line);
    reasons += "; " + line;
  }
  if (!any_complete && scans.empty()) return NoVersions();
  return Status::NotFound("persist dir '" + dir_ + "' has no complete version of job '" + job_id_ + "' that verifies" +
                          reasons);
}

}  // namespace ftrun
