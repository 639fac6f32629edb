#include "plugin/common/hash.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t
#include <emmintrin.h>           // SSE2 streaming stores (x86-64 baseline)
#include <xxh_x86dispatch.h>     // XXH3_*_dispatch: runtime AVX2/AVX512 choice

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace ftrun {
namespace {
// Small enough to stay in L2 between hashing and copying.
constexpr size_t kFuseBlock = 64 * 1024;
// Copies a block that was just hashed (so it sits in L2) with streaming
// stores: the destination is written without being read first, as a large
// memcpy does. Falls back to memcpy where dst is not 16-byte aligned.
void StreamCopy(char* dst, const char* src, size_t n) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0) {
    std::memcpy(dst, src, n);
    return;
  }
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  if (i < n) std::memcpy(dst + i, src + i, n - i);
}

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
  if (n == 0) return HashBytes(src, 0);
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
    StreamCopy(d + off, s + off, len);
  }
  _mm_sfence();  // order the streaming stores before the manifest is sent
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return ChunkHash{h.low64, h.high64};
}

uint32_t RecordChecksum(const void* data, size_t n) { return static_cast<uint32_t>(XXH3_64bits_dispatch(data, n)); }

}  // namespace ftrun
