// BytePool: byte buffers to reuse. A rebuild moves many pieces of the same
// length through its buffers (the survivor's staging, the replacement's
// receives), and fresh memory costs a page fault per 4 KiB; a buffer given
// back keeps its pages for the next piece. At most `keep` are kept.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ftrun {

class BytePool {
 public:
  explicit BytePool(size_t keep) : keep_(keep) {}

  // A buffer of `length` bytes (its bytes are whatever they were).
  std::vector<uint8_t> Take(uint64_t length) {
    std::vector<uint8_t> b;
    if (!spare_.empty()) {
      b = std::move(spare_.back());
      spare_.pop_back();
    }
    b.resize(length);
    return b;
  }
  void Give(std::vector<uint8_t> bytes) {
    if (spare_.size() < keep_) spare_.push_back(std::move(bytes));
  }
  void Clear() { spare_.clear(); }

 private:
  size_t keep_;
  std::vector<std::vector<uint8_t>> spare_;
};

}  // namespace ftrun
