// RegisteredArena: the store segment as CUDA sees it. Copies between the GPU
// and the store need the store's pages registered with CUDA (pinned) to run
// as DMA at full PCIe speed, but registering the whole store costs about
// 0.6 s per GiB in every rank (measured on an H100 machine: 6.3 s for a
// 10 GiB store) and pins memory the rank may never touch. So the segment is
// registered slice by slice, on first use: a rank pins the slices its saves
// and restores actually touch. Each slice is its own registration, so a
// copy is split where it crosses a slice boundary.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

class RegisteredArena {
 public:
  static constexpr uint64_t kSliceBytes = 256ull << 20;

  RegisteredArena(char* base, uint64_t size)
      : base_(base), size_(size), registered_((size + kSliceBytes - 1) / kSliceBytes) {}
  ~RegisteredArena();
  RegisteredArena(const RegisteredArena&) = delete;
  RegisteredArena& operator=(const RegisteredArena&) = delete;

  // Queue a copy of n bytes between device memory and the segment at
  // `offset`, on `stream`, registering the slices it touches first.
  Status CopyFromDevice(uint64_t offset, const void* src, uint64_t n, cudaStream_t stream);
  Status CopyToDevice(void* dst, uint64_t offset, uint64_t n, cudaStream_t stream);

  // Seconds spent in cudaHostRegister so far.
  double register_seconds() const { return register_seconds_; }

 private:
  // Calls copy(segment pointer, piece offset within the request, piece
  // length) for each slice-bounded piece of [offset, offset + n).
  template <typename F>
  Status ForEachPiece(uint64_t offset, uint64_t n, F&& copy);
  Status Register(size_t slice);

  char* const base_;
  const uint64_t size_;
  std::vector<bool> registered_;  // per slice
  double register_seconds_ = 0;
};

}  // namespace ftrun
