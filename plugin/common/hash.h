// Chunk identity: XXH3-128 of the chunk's bytes, and the fused hash+copy
// used on the save and restore paths so every byte is read from memory once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ftrun {

struct ChunkHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const ChunkHash& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const ChunkHash& o) const { return !(*this == o); }
  std::string ToHex() const;  // 32 hex characters, high word first
};

struct ChunkHashHasher {
  size_t operator()(const ChunkHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

// XXH3-128 of [data, data+n).
ChunkHash HashBytes(const void* data, size_t n);

// Copies n bytes from src to dst and returns the XXH3-128 of them. Works in
// cache-sized blocks: each block is hashed while it is in cache, then copied,
// so src is read from memory once.
ChunkHash HashAndCopy(void* dst, const void* src, size_t n);

// A 32-bit checksum for small plain-data records in shared memory.
uint32_t RecordChecksum(const void* data, size_t n);

}  // namespace ftrun
