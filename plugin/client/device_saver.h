// DeviceSaver: the CUDA save path. Chunks of device tensors are
// fingerprinted on the GPU; only chunks whose fingerprint changed are
// copied (cudaMemcpyAsync on a side stream) into shared memory registered
// with CUDA. Save returns once the copies are queued; Wait() fences them,
// computes the XXH3-128 chunk ids on the host and sends the manifest.
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
  // Copies n bytes of host memory to device memory (restore path).
  static Status CopyToDevice(void* dst, const void* src, uint64_t n);
  virtual ~DeviceSaver() = default;

  // Tensors may mix host and CUDA buffers.
  virtual Status Save(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                      SaveStats* stats) = 0;
  // Fences the last Save: its copies land, its manifest reaches the agent.
  virtual Status Wait() = 0;
};

}  // namespace ftrun
