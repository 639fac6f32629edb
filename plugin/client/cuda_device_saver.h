// CudaDeviceSaver: the CUDA implementation of DeviceSaver (device_saver.h).
// Its save half (set-up, fingerprints, queueing the copies) is in
// device_saver_cuda.cu; its landing half (the landing thread, the fence,
// restores' copies) in device_saver_landing.cu. Internal to libftrun.
#pragma once

#include <cuda_runtime.h>

#include <future>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "plugin/client/client_impl.h"
#include "plugin/client/cuda_status.h"
#include "plugin/client/device_saver.h"
#include "plugin/client/registered_arena.h"

namespace ftrun {

// A chunk's 128-bit fingerprint, as fingerprint_kernel.h computes it.
struct Fingerprint {
  unsigned long long a = 0, b = 0;
  bool operator==(const Fingerprint& o) const { return a == o.a && b == o.b; }
};
static_assert(sizeof(Fingerprint) == 2 * sizeof(unsigned long long));

class CudaDeviceSaver final : public DeviceSaver {
 public:
  CudaDeviceSaver(Client::Impl* client, int device) : client_(client), device_(device) {}
  ~CudaDeviceSaver() override;
  Status Init();
  Status Save(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
              const SaveOptions& options, SaveStats* stats) override;
  Status Wait() override;
  Status OrderAfterCopies(void* stream) override;
  Status CopyToDevice(void* dst, const void* src, uint64_t n, void* stream) override;
  Status FenceRestores() override;

 private:
  // Fingerprints of a tensor's chunks, and the chunk ids they were taken
  // with: a fingerprint match only proves a chunk unchanged if the client's
  // cache still names the same chunk (a Load or a host save may replace it).
  struct Known {
    uint64_t nbytes = 0;
    std::vector<Fingerprint> fps;
    std::vector<ChunkHash> ids;
  };
  struct Copy {
    size_t tensor, chunk;
    uint64_t offset;
  };

  Status Stage(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes);
  Status CheckPointer(const TensorRef& t) const;
  Status LaunchFingerprints(const std::vector<TensorRef>& tensors, const std::vector<size_t>& first, size_t total);
  Status QueueCopies(const std::vector<TensorRef>& tensors, const std::vector<size_t>& first);
  // The landing thread's work: waits for the copies, hashes what they wrote.
  Status Land();
  Status Fence();
  // The streams Save orders against: the caller's, or the default ones.
  std::vector<cudaStream_t> CallerStreams() const;
  void Drop();

  // Constant after Init.
  Client::Impl* const client_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;             // the producer's work at Save
  cudaEvent_t done_ = nullptr;              // the pending save's copies
  cudaEvent_t restored_ = nullptr;          // the last CopyToDevice
  std::unique_ptr<RegisteredArena> arena_;  // the store, registered slice by slice
  unsigned hash_threads_ = 1;

  // Guarded by the Client's one-caller-at-a-time rule.
  unsigned long long* dev_fps_ = nullptr;  // 2 words per chunk, grown as needed
  Fingerprint* host_fps_ = nullptr;        // pinned, same capacity
  size_t fps_capacity_ = 0;
  std::unordered_map<std::string, Known> known_;
  // The save whose copies may be in flight (pending_ true).
  bool pending_ = false;
  uint64_t version_ = 0;
  void* stream_arg_ = nullptr;  // the caller's stream at the pending Save
  bool order_caller_ = true;    // its later work waits for the copies
  std::vector<TensorRef> tensors_;
  PendingSave save_;
  std::vector<Copy> copies_;
  std::vector<ChunkHash> copied_ids_;  // per copy, set by the landing thread
  std::future<Status> landing_;
  // The stream of the last CopyToDevice; restored_ is recorded on it.
  cudaStream_t restore_stream_ = nullptr;
  bool restores_pending_ = false;
  std::vector<std::vector<Fingerprint>> new_fps_;  // per tensor; empty: keep known_
};

}  // namespace ftrun
