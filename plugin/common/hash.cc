#include "plugin/common/hash.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t
#include <xxh_x86dispatch.h>  // XXH3_*_dispatch: runtime AVX2/AVX512 choice

#include <cstdio>
#include <cstring>

namespace ftrun {
namespace {
// Small enough to stay in L2 between hashing and copying.
constexpr size_t kFuseBlock = 64 * 1024;
}  // namespace

std::string ChunkHash::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

ChunkHash HashBytes(const void* data, size_t n) {
  XXH128_hash_t h = XXH3_128bits_dispatch(data, n);
  return ChunkHash{h.low64, h.high64};
}

ChunkHash HashAndCopy(void* dst, const void* src, size_t n) {
  if (n <= kFuseBlock) {
    std::memcpy(dst, src, n);
    return HashBytes(dst, n);
  }
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t off = 0; off < n; off += kFuseBlock) {
    size_t len = n - off < kFuseBlock ? n - off : kFuseBlock;
    XXH3_128bits_update_dispatch(&state, s + off, len);
    std::memcpy(d + off, s + off, len);
  }
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return ChunkHash{h.low64, h.high64};
}

uint32_t RecordChecksum(const void* data, size_t n) {
  return static_cast<uint32_t>(XXH3_64bits_dispatch(data, n));
}

}  // namespace ftrun
