// ExtentAllocator: hands out page-aligned byte ranges of the arena's data
// area for chunks. Best fit by size, neighbours coalesced on free.
//
// Not thread-safe: owned by the agent's event-loop thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace ftrun {

class ExtentAllocator {
 public:
  static constexpr uint64_t kAlign = 4096;

  // Manages [base, base + capacity); base must be aligned.
  ExtentAllocator(uint64_t base, uint64_t capacity);

  // Rounds len up to kAlign. nullopt when no free extent is large enough.
  std::optional<uint64_t> Allocate(uint64_t len);
  // Frees an extent returned by Allocate with the same len.
  void Free(uint64_t offset, uint64_t len);

  // len rounded up to kAlign; nullopt when that does not fit in 64 bits (a
  // length near 2^64, e.g. from a corrupt manifest, must not wrap to 0).
  static std::optional<uint64_t> Rounded(uint64_t len) {
    if (len > UINT64_MAX - (kAlign - 1)) return std::nullopt;
    return (len + kAlign - 1) / kAlign * kAlign;
  }
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  uint64_t free_bytes() const { return capacity_ - used_; }
  uint64_t largest_free() const;

 private:
  void InsertFree(uint64_t offset, uint64_t len);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;     // offset -> len
  std::multimap<uint64_t, uint64_t> by_size_;  // len -> offset
};

}  // namespace ftrun
