// DeviceSaver: the CUDA save path. Chunks of device tensors are
// fingerprinted on the GPU; only chunks whose fingerprint changed are
// copied (cudaMemcpyAsync on a side stream) into shared memory registered
// with CUDA. Save returns once the copies are queued, ordered on the GPU
// against the caller's stream by events (no device-wide sync); a landing
// thread waits for them and computes the XXH3-128 chunk ids on the host;
// Wait() (or the next Save) sends the manifest.
//
// Built from device_saver_cuda.cu where nvcc exists; otherwise from
// device_saver_none.cc, whose Create reports kUnimplemented.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "ftrun/client.h"

namespace ftrun {

class DeviceSaver {
 public:
  // kUnimplemented without CUDA; kUnavailable when no usable GPU/driver.
  static Status Create(Client::Impl* client, std::unique_ptr<DeviceSaver>* out);
  virtual ~DeviceSaver() = default;

  // Tensors may mix host and CUDA buffers. options.cuda_stream is the
  // caller's stream (nullptr: the legacy and per-thread default streams):
  // the copies wait for its earlier work, and, with
  // options.order_cuda_stream, its later work waits for the copies.
  virtual Status Save(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                      const SaveOptions& options, SaveStats* stats) = 0;
  // Fences the last Save: its copies land, its manifest reaches the agent.
  virtual Status Wait() = 0;
  // Makes `stream`'s later work wait for the last Save's copies (GPU side).
  virtual Status OrderAfterCopies(void* stream) = 0;

  // Queues a copy of n bytes of the (registered) store at src to device
  // memory dst on `stream` (nullptr: the legacy default stream); src must
  // stay unchanged until FenceRestores returns.
  virtual Status CopyToDevice(void* dst, const void* src, uint64_t n, void* stream) = 0;
  // Waits until every copy CopyToDevice queued has landed.
  virtual Status FenceRestores() = 0;
};

}  // namespace ftrun
