// Helpers for the persist tests: scratch directories on a chosen filesystem,
// and a ChunkBank that builds manifests over deterministic bytes and serves
// them to PersistWriter as the agent's arena would.
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <sys/vfs.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "plugin/persist/env.h"
#include "plugin/persist/persist_writer.h"
#include "plugin/store/manifest.h"
#include "tests/catch.h"

namespace ftrun {

// A fresh directory under `base` ("" = $TMPDIR or /tmp), removed at the end.
class ScratchDir {
 public:
  explicit ScratchDir(std::string base = "") {
    if (base.empty()) {
      const char* t = getenv("TMPDIR");
      base = t && *t ? t : "/tmp";
    }
    std::string tmpl = base + "/ftrun_persist.XXXXXX";
    REQUIRE(mkdtemp(&tmpl[0]) != nullptr);
    path_ = tmpl;
  }
  ~ScratchDir() {
    nftw(
        path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline long FsType(const std::string& path) {
  struct statfs st {};
  REQUIRE(statfs(path.c_str(), &st) == 0);
  return static_cast<long>(st.f_type);
}
inline constexpr long kExt4Magic = 0xEF53;
inline constexpr long kXfsMagic = 0x58465342;
inline constexpr long kTmpfsMagic = 0x01021994;

// Deterministic bytes: xorshift from a seed.
inline std::string Pattern(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

struct TensorSpec {
  std::string name;
  size_t bytes;
  uint64_t seed;  // same seed and size, same bytes
};

class ChunkBank {
 public:
  // Rank `rank`'s manifest at `version`: uint8 tensors split into chunks of
  // at most `chunk` bytes. Offsets are set (as in the store) to check that
  // the disk format drops them.
  Manifest Build(int rank, uint64_t version, const std::vector<TensorSpec>& specs, size_t chunk = 64 << 10) {
    Manifest m;
    m.rank = rank;
    m.version = version;
    m.user_bytes = "rng state of rank " + std::to_string(rank) + " at " + std::to_string(version);
    for (const auto& spec : specs) {
      TensorManifest t;
      t.info = {spec.name, DType::kUInt8, {static_cast<int64_t>(spec.bytes)}, spec.bytes, Device::kHost};
      std::string all = Pattern(spec.seed, spec.bytes);
      for (size_t off = 0; off < spec.bytes; off += chunk) {
        std::string piece = all.substr(off, chunk);
        ChunkHash h = HashBytes(piece.data(), piece.size());
        bytes_[h] = piece;
        t.chunks.push_back({h, piece.size(), off});
      }
      m.tensors.push_back(std::move(t));
    }
    return m;
  }
  const std::string& Bytes(const ChunkHash& h) const { return bytes_.at(h); }
  ChunkSource Source() {
    return [this](const ChunkRef& ref, const void** data) {
      auto it = bytes_.find(ref.hash);
      if (it == bytes_.end()) return Status::NotFound("no chunk " + ref.hash.ToHex() + " in the test bank");
      ++reads_;
      *data = it->second.data();
      return Status::Ok();
    };
  }
  int reads() const { return reads_; }

 private:
  std::unordered_map<ChunkHash, std::string, ChunkHashHasher> bytes_;
  int reads_ = 0;
};

inline std::vector<const Manifest*> Ptrs(const std::vector<Manifest>& ms) {
  std::vector<const Manifest*> out;
  for (const auto& m : ms) out.push_back(&m);
  return out;
}

inline PersistWriterOptions WriterOptions(Env* env, const std::string& dir, const std::string& job, int world,
                                          int node = 0) {
  PersistWriterOptions o;
  o.env = env;
  o.dir = dir;
  o.job_id = job;
  o.world_size = world;
  o.node = node;
  return o;
}

inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace ftrun
