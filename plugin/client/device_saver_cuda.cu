// The CUDA save path (see device_saver.h). Unchanged chunks are found on the
// GPU, so they never cross PCIe; changed ones are DMA'd straight into the
// store segment, which is registered with CUDA so the copies need no bounce
// buffer. XXH3 chunk ids are computed on the host by a landing thread once
// the bytes have landed (device_saver_landing.cu), so the rank's Save only
// pays for the fingerprint kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "plugin/client/cuda_device_saver.h"
#include "plugin/client/fingerprint_kernel.h"

namespace ftrun {

CudaDeviceSaver::~CudaDeviceSaver() {
  // In-flight copies write into the arena: let them land before it is
  // unregistered (and then unmapped by the client). Errors are moot here.
  if (landing_.valid()) landing_.wait();
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  if (restores_pending_) (void)cudaEventSynchronize(restored_);
  arena_.reset();  // unregistered once no copy uses it (the client unmaps it after)
  if (dev_fps_ != nullptr) (void)cudaFree(dev_fps_);
  if (host_fps_ != nullptr) (void)cudaFreeHost(host_fps_);
  if (done_ != nullptr) (void)cudaEventDestroy(done_);
  if (restored_ != nullptr) (void)cudaEventDestroy(restored_);
  if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Status CudaDeviceSaver::Init() {
  constexpr Code kU = Code::kUnavailable;
  // Non-blocking: the side stream must not serialize with the trainer's
  // default-stream work; it waits only on what Save hands it.
  FTRUN_RETURN_IF_ERROR(
      Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the copy stream", kU));
  FTRUN_RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "creating an event", kU));
  FTRUN_RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "creating an event", kU));
  FTRUN_RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&restored_, cudaEventDisableTiming), "creating an event", kU));
  hash_threads_ = std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u);
  arena_ = std::make_unique<RegisteredArena>(client_->arena().base(), client_->arena().size());
  return Status::Ok();
}

Status CudaDeviceSaver::CheckPointer(const TensorRef& t) const {
  if (t.nbytes == 0) return Status::Ok();
  const std::string where = "rank " + std::to_string(client_->rank) + ": CUDA tensor '" + t.name + "'";
  const char* first = static_cast<const char*>(t.data);
  for (const char* p : {first, first + (t.nbytes - 1)}) {
    cudaPointerAttributes a{};
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // do not leave our failure for the trainer to find
      return Status::InvalidArgument(where + ": cannot query its pointer: " + cudaGetErrorString(e));
    }
    if (a.type != cudaMemoryTypeDevice) {
      return Status::InvalidArgument(where + " is not device memory (cudaMalloc'd); memory type " +
                                     std::to_string(static_cast<int>(a.type)));
    }
    if (a.device != device_) {
      return Status::InvalidArgument(where + " is on device " + std::to_string(a.device) +
                                     ", the saver uses the current device " + std::to_string(device_));
    }
  }
  return Status::Ok();
}

Status CudaDeviceSaver::LaunchFingerprints(const std::vector<TensorRef>& tensors, const std::vector<size_t>& first,
                                           size_t total) {
  if (total == 0) return Status::Ok();
  if (total > fps_capacity_) {
    if (dev_fps_ != nullptr) (void)cudaFree(dev_fps_);
    if (host_fps_ != nullptr) (void)cudaFreeHost(host_fps_);
    dev_fps_ = nullptr;
    host_fps_ = nullptr;
    fps_capacity_ = 0;
    FTRUN_RETURN_IF_ERROR(Cuda(cudaMalloc(&dev_fps_, total * sizeof(Fingerprint)), "allocating fingerprints"));
    FTRUN_RETURN_IF_ERROR(Cuda(cudaMallocHost(&host_fps_, total * sizeof(Fingerprint)), "allocating fingerprints"));
    fps_capacity_ = total;
  }
  // The side stream must see what the caller's stream wrote before Save
  // (without a stream: the legacy and the per-thread default streams).
  for (cudaStream_t producer : CallerStreams()) {
    FTRUN_RETURN_IF_ERROR(Cuda(cudaEventRecord(ready_, producer), "recording the trainer's stream"));
    FTRUN_RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(stream_, ready_, 0), "ordering the copy stream"));
  }
  FTRUN_RETURN_IF_ERROR(
      Cuda(cudaMemsetAsync(dev_fps_, 0, total * sizeof(Fingerprint), stream_), "clearing fingerprints"));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (first[i] == SIZE_MAX) continue;
    const TensorRef& t = tensors[i];
    FTRUN_RETURN_IF_ERROR(
        Cuda(LaunchChunkFingerprints(t.data, t.nbytes, client_->chunk_size, dev_fps_ + 2 * first[i], stream_),
             "launching the chunk fingerprint kernel"));
  }
  return Cuda(cudaMemcpyAsync(host_fps_, dev_fps_, total * sizeof(Fingerprint), cudaMemcpyDeviceToHost, stream_),
              "copying fingerprints to the host");
}

Status CudaDeviceSaver::Stage(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes) {
  FTRUN_RETURN_IF_ERROR(client_->CheckTensors(tensors));
  int current = -1;
  FTRUN_RETURN_IF_ERROR(Cuda(cudaGetDevice(&current), "cudaGetDevice"));
  if (current != device_) {
    return Status::FailedPrecondition("rank " + std::to_string(client_->rank) +
                                      ": the CUDA saver was set up on device " + std::to_string(device_) +
                                      ", the current device is " + std::to_string(current));
  }
  const uint64_t cs = client_->chunk_size;
  std::vector<size_t> first(tensors.size(), SIZE_MAX);  // where each tensor's fingerprints land
  size_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (t.device != Device::kCuda) continue;
    FTRUN_RETURN_IF_ERROR(CheckPointer(t));
    const CachedTensor* prev = client_->Cached(t);
    const bool skip = prev != nullptr && t.generation != 0 && prev->generation == t.generation;
    if (!skip && t.nbytes > 0) {
      first[i] = total;
      total += static_cast<size_t>((t.nbytes + cs - 1) / cs);
    }
  }
  version_ = version;
  tensors_ = tensors;
  client_->BeginSave(version, tensors, user_bytes, &save_);
  // The kernels run while the host tensors are staged.
  FTRUN_RETURN_IF_ERROR(LaunchFingerprints(tensors, first, total));
  Status s = client_->StageHost(tensors, &save_);
  if (s.code() == Code::kResourceExhausted) {
    // As on the host path: hash host chunks first so only changed ones need room.
    client_->ForgetChangeHistory();
    client_->BeginSave(version, tensors, user_bytes, &save_);
    s = client_->StageHost(tensors, &save_);
  }
  FTRUN_RETURN_IF_ERROR(s);
  // The CPU waits for the fingerprints (and so for the caller's stream to
  // reach Save) to decide which chunks to copy; not for any copy.
  if (total > 0) FTRUN_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "fingerprinting CUDA tensors"));
  FTRUN_RETURN_IF_ERROR(QueueCopies(tensors, first));
  pending_ = true;
  return Status::Ok();
}

// Device chunks: referenced by id when skipped or unchanged, else queued for
// copying into a reserved extent (their ids come in Fence).
Status CudaDeviceSaver::QueueCopies(const std::vector<TensorRef>& tensors, const std::vector<size_t>& first) {
  const uint64_t cs = client_->chunk_size;
  SaveStats& st = save_.stats;
  std::vector<uint64_t> lengths;
  copies_.clear();
  new_fps_.assign(tensors.size(), {});
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (t.device != Device::kCuda) continue;
    std::vector<ChunkRef>& chunks = save_.manifest.tensors[i].chunks;
    const CachedTensor* prev = client_->Cached(t);
    if (first[i] == SIZE_MAX) {  // unchanged by generation (or empty)
      for (size_t j = 0; j < chunks.size(); ++j) chunks[j].hash = prev->hashes[j];
      st.chunks_skipped += chunks.size();
      continue;
    }
    const Fingerprint* fp = host_fps_ + first[i];
    new_fps_[i].assign(fp, fp + chunks.size());
    auto it = known_.find(t.name);
    const Known* old = it != known_.end() && it->second.nbytes == t.nbytes && it->second.fps.size() == chunks.size()
                           ? &it->second
                           : nullptr;
    st.bytes_hashed += t.nbytes;
    for (size_t j = 0; j < chunks.size(); ++j) {
      if (prev != nullptr && old != nullptr && old->fps[j] == fp[j] && old->ids[j] == prev->hashes[j]) {
        chunks[j].hash = prev->hashes[j];
        st.chunks_unchanged++;
      } else {
        copies_.push_back({i, j, kNoOffset});
        lengths.push_back(chunks[j].length);
      }
    }
  }
  std::vector<uint64_t> offsets;
  FTRUN_RETURN_IF_ERROR(client_->Reserve(&save_, lengths, &offsets));
  // One copy per run of consecutive chunks of a tensor that landed in
  // consecutive extents (a full save: about one per tensor).
  for (size_t k = 0; k < copies_.size();) {
    copies_[k].offset = offsets[k];
    uint64_t bytes = lengths[k];
    size_t end = k + 1;
    while (end < copies_.size() && copies_[end].tensor == copies_[k].tensor &&
           copies_[end].chunk == copies_[end - 1].chunk + 1 && offsets[end] == offsets[end - 1] + lengths[end - 1]) {
      copies_[end].offset = offsets[end];
      bytes += lengths[end];
      ++end;
    }
    const char* src = static_cast<const char*>(tensors[copies_[k].tensor].data) + copies_[k].chunk * cs;
    FTRUN_RETURN_IF_ERROR(arena_->CopyFromDevice(offsets[k], src, bytes, stream_));
    st.chunks_copied += end - k;
    st.bytes_copied += bytes;
    k = end;
  }
  FTRUN_RETURN_IF_ERROR(Cuda(cudaEventRecord(done_, stream_), "recording the chunk copies"));
  // The caller's later work (its next optimizer step) must not overwrite
  // the tensors before the copies have read them: a GPU-side wait.
  for (cudaStream_t consumer : CallerStreams()) {
    if (!order_caller_) break;
    FTRUN_RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(consumer, done_, 0), "ordering the trainer's stream"));
  }
  try {
    landing_ = std::async(std::launch::async, [this] { return Land(); });
  } catch (const std::system_error& e) {
    return Status(Code::kResourceExhausted, std::string("starting the landing thread: ") + e.what());
  }
  return Status::Ok();
}

std::vector<cudaStream_t> CudaDeviceSaver::CallerStreams() const {
  if (stream_arg_ != nullptr) return {static_cast<cudaStream_t>(stream_arg_)};
  return {cudaStreamLegacy, cudaStreamPerThread};
}

Status CudaDeviceSaver::Save(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                             const SaveOptions& options, SaveStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  FTRUN_RETURN_IF_ERROR(Wait());
  stream_arg_ = options.cuda_stream;
  order_caller_ = options.order_cuda_stream;
  Status s = Stage(version, tensors, user_bytes);
  if (!s.ok()) {
    Drop();
    return s;
  }
  save_.stats.stall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stats != nullptr) *stats = save_.stats;
  return Status::Ok();
}

Status DeviceSaver::Create(Client::Impl* client, std::unique_ptr<DeviceSaver>* out) {
  int count = 0;
  FTRUN_RETURN_IF_ERROR(
      Cuda(cudaGetDeviceCount(&count), "no usable CUDA device: cudaGetDeviceCount", Code::kUnavailable));
  if (count == 0) return Status::Unavailable("no CUDA device visible to this rank (check CUDA_VISIBLE_DEVICES)");
  int device = -1;
  FTRUN_RETURN_IF_ERROR(Cuda(cudaGetDevice(&device), "cudaGetDevice", Code::kUnavailable));
  auto saver = std::make_unique<CudaDeviceSaver>(client, device);
  FTRUN_RETURN_IF_ERROR(saver->Init());
  *out = std::move(saver);
  return Status::Ok();
}

}  // namespace ftrun
