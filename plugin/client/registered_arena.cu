// RegisteredArena (see registered_arena.h).
#include <algorithm>
#include <chrono>
#include <string>

#include "plugin/client/cuda_status.h"
#include "plugin/client/registered_arena.h"

namespace ftrun {
RegisteredArena::~RegisteredArena() {
  for (size_t s = 0; s < registered_.size(); ++s) {
    if (registered_[s]) (void)cudaHostUnregister(base_ + s * kSliceBytes);
  }
}

Status RegisteredArena::Register(size_t slice) {
  if (registered_[slice]) return Status::Ok();
  const uint64_t begin = slice * kSliceBytes, len = std::min(kSliceBytes, size_ - begin);
  const auto t0 = std::chrono::steady_clock::now();
  cudaError_t e = cudaHostRegister(base_ + begin, len, cudaHostRegisterDefault);
  register_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave our failure for the trainer to find
    return Cuda(e, "registering " + std::to_string(len >> 20) + " MiB of the store at offset " + std::to_string(begin) +
                       " with CUDA (cudaHostRegister)");
  }
  registered_[slice] = true;
  return Status::Ok();
}

template <typename F>
Status RegisteredArena::ForEachPiece(uint64_t offset, uint64_t n, F&& copy) {
  if (offset > size_ || n > size_ - offset) {
    return Status::InvalidArgument("a copy of " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                                   " lies outside the store segment (" + std::to_string(size_) + " bytes)");
  }
  for (uint64_t done = 0; done < n;) {
    const uint64_t at = offset + done;
    const size_t slice = at / kSliceBytes;
    const uint64_t piece = std::min(n - done, (slice + 1) * kSliceBytes - at);
    FTRUN_RETURN_IF_ERROR(Register(slice));
    FTRUN_RETURN_IF_ERROR(copy(base_ + at, done, piece));
    done += piece;
  }
  return Status::Ok();
}

Status RegisteredArena::CopyFromDevice(uint64_t offset, const void* src, uint64_t n, cudaStream_t stream) {
  return ForEachPiece(offset, n, [&](char* seg, uint64_t from, uint64_t len) {
    return Cuda(cudaMemcpyAsync(seg, static_cast<const char*>(src) + from, len, cudaMemcpyDeviceToHost, stream),
                "queueing a device-to-host chunk copy");
  });
}

Status RegisteredArena::CopyToDevice(void* dst, uint64_t offset, uint64_t n, cudaStream_t stream) {
  return ForEachPiece(offset, n, [&](char* seg, uint64_t from, uint64_t len) {
    return Cuda(cudaMemcpyAsync(static_cast<char*>(dst) + from, seg, len, cudaMemcpyHostToDevice, stream),
                "copying a restored tensor to the device");
  });
}

}  // namespace ftrun
