// DeviceSaver for builds without CUDA: device tensors are refused clearly.
#include "plugin/client/device_saver.h"

namespace ftrun {

Status DeviceSaver::Create(Client::Impl*, std::unique_ptr<DeviceSaver>*) {
  return Status::Unimplemented(
      "this libftrun was built without CUDA (no nvcc at build time); "
      "cannot save CUDA tensors or restore into CUDA memory");
}

}  // namespace ftrun
