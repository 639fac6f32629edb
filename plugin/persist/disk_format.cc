// Encoding and decoding of the persist directory's names and files.
#include "plugin/persist/disk_format.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "plugin/common/bytes.h"

namespace ftrun {
namespace {

constexpr uint64_t Magic(const char (&s)[9]) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[i]);
  return v;
}
constexpr uint64_t kChunkMagic = Magic("FTRCHUNK");
constexpr uint64_t kManifestMagic = Magic("FTRMANIF");
constexpr uint64_t kMarkerMagic = Magic("FTRCMPLT");
constexpr size_t kTrailer = 16;  // XXH3-128

bool ParseDecimal(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, static_cast<uint64_t>(c - '0'), &v))
      return false;
  }
  *out = v;
  return true;
}

bool ParseIndex(const std::string& name, const std::string& prefix, const std::string& suffix, int* out) {
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  uint64_t v = 0;
  std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (!ParseDecimal(digits, &v) || v > INT32_MAX || std::to_string(v) != digits) return false;
  *out = static_cast<int>(v);
  return true;
}

void PutHash(ByteWriter* w, const ChunkHash& h) {
  w->Put<uint64_t>(h.lo);
  w->Put<uint64_t>(h.hi);
}
ChunkHash GetHash(ByteReader* r) {
  ChunkHash h;
  h.lo = r->Get<uint64_t>();
  h.hi = r->Get<uint64_t>();
  return h;
}

// Appends the trailer: XXH3-128 of everything before it.
std::string Seal(ByteWriter* w) {
  ChunkHash sum = HashBytes(w->data().data(), w->data().size());
  PutHash(w, sum);
  return w->Take();
}

// Checks magic, trailer and format version of a sealed file; on success *body
// reads the fields after the format version.
Status Unseal(const std::string& bytes, const std::string& path, uint64_t magic, const char* kind,
              std::string_view* body, uint32_t newest = kPersistFormatVersion, uint32_t* got = nullptr) {
  ByteReader head(bytes);
  if (bytes.size() < 12 + kTrailer || head.Get<uint64_t>() != magic) {
    return Status::Corruption("persist file '" + path + "' is not an ftrun " + kind + " file (" +
                              std::to_string(bytes.size()) + " bytes, wrong magic)");
  }
  ByteReader tail(std::string_view(bytes).substr(bytes.size() - kTrailer));
  if (GetHash(&tail) != HashBytes(bytes.data(), bytes.size() - kTrailer)) {
    return Status::Corruption("persist file '" + path + "': " + kind + " checksum mismatch (torn or corrupted)");
  }
  uint32_t format = head.Get<uint32_t>();
  if (format < 1 || format > newest || (got == nullptr && format != newest)) {
    return Status::FailedPrecondition("persist file '" + path + "' has format version " + std::to_string(format) +
                                      "; this build reads " + (got == nullptr ? "version " : "versions 1 to ") +
                                      std::to_string(newest));
  }
  if (got != nullptr) *got = format;
  *body = std::string_view(bytes).substr(12, bytes.size() - 12 - kTrailer);
  return Status::Ok();
}

}  // namespace

std::string PersistJobDir(const std::string& dir, const std::string& job_id) { return dir + "/" + job_id; }
std::string ChunksDir(const std::string& job_dir) { return job_dir + "/chunks"; }
std::string ChunkSubdir(const std::string& job_dir, const ChunkHash& hash) {
  return ChunksDir(job_dir) + "/" + hash.ToHex().substr(0, 2);
}
std::string ChunkPath(const std::string& job_dir, const ChunkHash& hash) {
  return ChunkSubdir(job_dir, hash) + "/" + hash.ToHex();
}
std::string VersionDirName(uint64_t version) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "v%020" PRIu64, version);
  return buf;
}
std::string VersionDir(const std::string& job_dir, uint64_t version) { return job_dir + "/" + VersionDirName(version); }
std::string ManifestFileName(int rank) { return "rank" + std::to_string(rank) + ".manifest"; }
std::string NodeMarkerName(int node) { return "node" + std::to_string(node) + ".COMPLETE"; }
std::string TmpName(const std::string& path, int node) { return path + ".n" + std::to_string(node) + ".tmp"; }
std::string GcName(const std::string& chunk_path) { return chunk_path + ".gc"; }

bool ParseVersionDirName(const std::string& name, uint64_t* version) {
  return name.size() == 21 && name[0] == 'v' && ParseDecimal(name.substr(1), version);
}
bool ParseManifestFileName(const std::string& name, int* rank) { return ParseIndex(name, "rank", ".manifest", rank); }
bool ParseNodeMarkerName(const std::string& name, int* node) { return ParseIndex(name, "node", ".COMPLETE", node); }

bool ParseChunkFileName(const std::string& name, ChunkHash* hash) {
  if (name.size() != 32) return false;
  uint64_t words[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    char c = name[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    words[i / 16] = (words[i / 16] << 4) | static_cast<uint64_t>(d);
  }
  *hash = ChunkHash{words[1], words[0]};  // ToHex writes the high word first
  return true;
}

bool ParseGcChunkFileName(const std::string& name, ChunkHash* hash) {
  return name.size() == 35 && name.compare(32, 3, ".gc") == 0 && ParseChunkFileName(name.substr(0, 32), hash);
}

bool IsTmpName(const std::string& name, int* node) {
  size_t dot = name.rfind(".n");
  if (dot == std::string::npos) return false;
  return ParseIndex(name.substr(dot), ".n", ".tmp", node);
}

void EncodeChunkHeader(const ChunkHash& hash, uint64_t length, char out[kChunkHeaderSize]) {
  ByteWriter w;
  w.Put<uint64_t>(kChunkMagic);
  w.Put<uint32_t>(kPersistFormatVersion);
  w.Put<uint32_t>(static_cast<uint32_t>(kChunkHeaderSize));
  PutHash(&w, hash);
  w.Put<uint64_t>(length);
  std::memset(out, 0, kChunkHeaderSize);
  std::memcpy(out, w.data().data(), w.data().size());
  // The checksum closes the header and covers all of it, padding included.
  uint32_t sum = RecordChecksum(out, kChunkHeaderSize - 4);
  std::memcpy(out + kChunkHeaderSize - 4, &sum, 4);
}

Status DecodeChunkHeader(const char* data, size_t n, const std::string& path, ChunkHash* hash, uint64_t* length) {
  ByteReader r(std::string_view(data, n));
  if (n < kChunkHeaderSize || r.Get<uint64_t>() != kChunkMagic) {
    return Status::Corruption("chunk file '" + path + "' has no chunk header (wrong magic or shorter than " +
                              std::to_string(kChunkHeaderSize) + " bytes)");
  }
  uint32_t format = r.Get<uint32_t>();
  uint32_t header_size = r.Get<uint32_t>();
  ChunkHash h = GetHash(&r);
  uint64_t len = r.Get<uint64_t>();
  uint32_t sum = 0;
  std::memcpy(&sum, data + kChunkHeaderSize - 4, 4);
  if (!r.ok() || sum != RecordChecksum(data, kChunkHeaderSize - 4)) {
    return Status::Corruption("chunk file '" + path + "': header checksum mismatch (torn or corrupted)");
  }
  if (format != kPersistFormatVersion || header_size != kChunkHeaderSize) {
    return Status::FailedPrecondition("chunk file '" + path + "' has format version " + std::to_string(format) +
                                      "; this build reads version " + std::to_string(kPersistFormatVersion));
  }
  *hash = h;
  *length = len;
  return Status::Ok();
}

ChunkHash FileChecksum(const std::string& bytes) { return HashBytes(bytes.data(), bytes.size()); }

std::string EncodeManifestFile(const std::string& job_id, int world_size, const Manifest& m) {
  Manifest on_disk = m;
  for (auto& t : on_disk.tensors) {
    for (auto& c : t.chunks) c.offset = kNoOffset;
  }
  ByteWriter w;
  w.Put<uint64_t>(kManifestMagic);
  w.Put<uint32_t>(kPersistFormatVersion);
  w.PutString(job_id);
  w.Put<int32_t>(world_size);
  w.Put<int32_t>(m.rank);
  w.Put<uint64_t>(m.version);
  EncodeManifest(on_disk, &w);
  return Seal(&w);
}

Status DecodeManifestFile(const std::string& bytes, const std::string& path, ManifestFile* out) {
  std::string_view body;
  FTRUN_RETURN_IF_ERROR(Unseal(bytes, path, kManifestMagic, "manifest", &body));
  ByteReader r(body);
  ManifestFile f;
  f.job_id = r.GetString();
  f.world_size = r.Get<int32_t>();
  int32_t rank = r.Get<int32_t>();
  uint64_t version = r.Get<uint64_t>();
  if (!r.ok()) return Status::Corruption("persist file '" + path + "': truncated manifest header");
  FTRUN_RETURN_IF_ERROR(DecodeManifest(&r, "persist file '" + path + "'", &f.manifest));
  if (!r.done()) return Status::Corruption("persist file '" + path + "': bytes after the manifest");
  // (DecodeManifest checked every chunk's length: it sizes the store
  // reservation and the read of the chunk file.)
  if (f.manifest.rank != rank || f.manifest.version != version) {
    return Status::Corruption("persist file '" + path + "': header says rank " + std::to_string(rank) + " version " +
                              std::to_string(version) + ", the manifest rank " + std::to_string(f.manifest.rank) +
                              " version " + std::to_string(f.manifest.version));
  }
  *out = std::move(f);
  return Status::Ok();
}

std::string EncodeNodeMarker(const NodeMarker& m) {
  ByteWriter w;
  w.Put<uint64_t>(kMarkerMagic);
  w.Put<uint32_t>(m.has_epoch ? kMarkerFormatVersion : 1);  // format 1 only for tests of the old format
  w.PutString(m.job_id);
  w.Put<int32_t>(m.world_size);
  w.Put<uint64_t>(m.version);
  w.Put<int32_t>(m.node);
  if (m.has_epoch) w.Put<uint64_t>(m.epoch);
  w.Put<uint32_t>(static_cast<uint32_t>(m.ranks.size()));
  for (const auto& r : m.ranks) {
    w.Put<int32_t>(r.rank);
    w.Put<uint64_t>(r.manifest_size);
    PutHash(&w, r.manifest_checksum);
  }
  return Seal(&w);
}

Status DecodeNodeMarker(const std::string& bytes, const std::string& path, NodeMarker* out) {
  std::string_view body;
  uint32_t format = 0;
  FTRUN_RETURN_IF_ERROR(Unseal(bytes, path, kMarkerMagic, "COMPLETE marker", &body, kMarkerFormatVersion, &format));
  ByteReader r(body);
  NodeMarker m;
  m.job_id = r.GetString();
  m.world_size = r.Get<int32_t>();
  m.version = r.Get<uint64_t>();
  m.node = r.Get<int32_t>();
  m.has_epoch = format >= 2;
  if (m.has_epoch) m.epoch = r.Get<uint64_t>();
  m.ranks.resize(r.GetCount(4 + 8 + 16));
  for (auto& e : m.ranks) {
    e.rank = r.Get<int32_t>();
    e.manifest_size = r.Get<uint64_t>();
    e.manifest_checksum = GetHash(&r);
  }
  if (!r.ok() || !r.done()) return Status::Corruption("persist file '" + path + "': malformed COMPLETE marker");
  *out = std::move(m);
  return Status::Ok();
}

std::string MarkerEpochString(const NodeMarker& m) {
  return m.has_epoch ? "epoch " + std::to_string(m.epoch) : "no epoch (format 1, written before epochs)";
}

}  // namespace ftrun
