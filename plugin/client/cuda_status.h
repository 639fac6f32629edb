// A CUDA runtime error as a Status naming what failed, e.g.
// "queueing a device-to-host chunk copy: cudaErrorInvalidValue (invalid
// argument)". Shared by libftrun's CUDA files.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "ftrun/status.h"

namespace ftrun {

inline Status Cuda(cudaError_t e, const std::string& what, Code code = Code::kIoError) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(code, what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace ftrun
