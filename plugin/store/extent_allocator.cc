#include "plugin/store/extent_allocator.h"

#include <iterator>

#include "plugin/common/check.h"

namespace ftrun {

ExtentAllocator::ExtentAllocator(uint64_t base, uint64_t capacity) : capacity_(capacity / kAlign * kAlign) {
  FTRUN_CHECK(base % kAlign == 0);
  if (capacity_ > 0) InsertFree(base, capacity_);
}

void ExtentAllocator::InsertFree(uint64_t offset, uint64_t len) {
  by_offset_.emplace(offset, len);
  by_size_.emplace(len, offset);
}

void ExtentAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  auto range = by_size_.equal_range(it->second);
  for (auto s = range.first; s != range.second; ++s) {
    if (s->second == it->first) {
      by_size_.erase(s);
      break;
    }
  }
  by_offset_.erase(it);
}

std::optional<uint64_t> ExtentAllocator::Allocate(uint64_t len) {
  std::optional<uint64_t> rounded = Rounded(len == 0 ? 1 : len);
  if (!rounded) return std::nullopt;  // larger than any arena
  len = *rounded;
  auto fit = by_size_.lower_bound(len);
  if (fit == by_size_.end()) return std::nullopt;
  uint64_t offset = fit->second;
  uint64_t have = fit->first;
  EraseFree(by_offset_.find(offset));
  if (have > len) InsertFree(offset + len, have - len);
  used_ += len;
  return offset;
}

void ExtentAllocator::Free(uint64_t offset, uint64_t len) {
  std::optional<uint64_t> rounded = Rounded(len == 0 ? 1 : len);
  FTRUN_CHECK(rounded.has_value());  // Allocate gave it out: it rounds
  len = *rounded;
  FTRUN_CHECK(used_ >= len);
  used_ -= len;
  auto next = by_offset_.lower_bound(offset);
  FTRUN_CHECK(next == by_offset_.end() || next->first >= offset + len);  // no double free
  if (next != by_offset_.end() && next->first == offset + len) {
    len += next->second;
    auto erase = next++;
    EraseFree(erase);
  }
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    FTRUN_CHECK(prev->first + prev->second <= offset);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      len += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(offset, len);
}

uint64_t ExtentAllocator::largest_free() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }

}  // namespace ftrun
