// The CUDA save path (see device_saver.h). Unchanged chunks are found on the
// GPU, so they never cross PCIe; changed ones are DMA'd straight into the
// store segment, which is registered with CUDA so the copies need no bounce
// buffer. XXH3 chunk ids are computed on the host by a landing thread once
// the bytes have landed, so the rank's Save only pays for the fingerprint
// kernel; Wait() (or the next Save) joins it and sends the manifest.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "plugin/client/client_impl.h"
#include "plugin/client/device_saver.h"
#include "plugin/client/fingerprint_kernel.h"
#include "plugin/client/registered_arena.h"

namespace ftrun {
namespace {

Status Cuda(cudaError_t e, const char* what, Code code = Code::kIoError) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(code, std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

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
  cudaEvent_t ready_ = nullptr;     // the producer's work at Save
  cudaEvent_t done_ = nullptr;      // the pending save's copies
  cudaEvent_t restored_ = nullptr;  // the last CopyToDevice
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
  arena_ = std::make_unique<RegisteredArena>(client_->arena.base(), client_->arena.size());
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

Status CudaDeviceSaver::Stage(uint64_t version, const std::vector<TensorRef>& tensors,
                              std::string_view user_bytes) {
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
  landing_ = std::async(std::launch::async, [this] { return Land(); });
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

Status CudaDeviceSaver::Land() {
  FTRUN_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(done_), "copying CUDA chunks into shared memory"));
  copied_ids_.assign(copies_.size(), ChunkHash{});
  const unsigned threads = static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(hash_threads_, copies_.size())));
  auto hash_every = [this, threads](size_t first) {
    for (size_t k = first; k < copies_.size(); k += threads) {
      const Copy& c = copies_[k];
      const uint64_t length = save_.manifest.tensors[c.tensor].chunks[c.chunk].length;
      copied_ids_[k] = HashBytes(client_->arena.base() + c.offset, length);
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < threads; ++t) helpers.emplace_back(hash_every, t);
  hash_every(0);
  for (std::thread& h : helpers) h.join();
  return Status::Ok();
}

Status CudaDeviceSaver::Fence() {
  FTRUN_RETURN_IF_ERROR(landing_.get());
  for (size_t k = 0; k < copies_.size(); ++k) {
    const Copy& c = copies_[k];
    ChunkRef& ref = save_.manifest.tensors[c.tensor].chunks[c.chunk];
    ref.hash = copied_ids_[k];
    ref.offset = c.offset;
    save_.fresh[c.tensor].changed_last[c.chunk] = true;
  }
  FTRUN_RETURN_IF_ERROR(client_->SendManifest(&save_));
  for (size_t i = 0; i < new_fps_.size(); ++i) {
    if (new_fps_[i].empty()) continue;
    Known& k = known_[tensors_[i].name];
    k.nbytes = tensors_[i].nbytes;
    k.fps = std::move(new_fps_[i]);
    k.ids.clear();
    for (const ChunkRef& c : save_.manifest.tensors[i].chunks) k.ids.push_back(c.hash);
  }
  Drop();  // done: nothing in flight any more
  return Status::Ok();
}

Status CudaDeviceSaver::Wait() {
  if (!pending_) return Status::Ok();
  Status s = Fence();
  if (!s.ok()) {
    Drop();
    if (s.code() == Code::kChunkMissing) {
      // The store dropped a chunk this save referenced by id (its version
      // was discarded at a restart). The tensors may have changed since
      // Save returned (the caller's stream only waited for the copies), so
      // the save cannot be redone: it is refused, and the next one copies
      // every chunk.
      client_->cache.clear();
      known_.clear();
      return Status(s.code(), "version " + std::to_string(version_) + " was not saved: " + s.message() +
                                  "; the next save copies every chunk");
    }
  }
  return s;
}

void CudaDeviceSaver::Drop() {
  // The landing thread reads copies_ and the arena; copies may still be
  // writing into extents the agent will hand out again (and fingerprints
  // into host_fps_). Cheap when the stream is idle.
  if (landing_.valid()) landing_.wait();
  landing_ = {};
  (void)cudaStreamSynchronize(stream_);
  pending_ = false;
  copies_.clear();
  copied_ids_.clear();
  new_fps_.clear();
  tensors_.clear();
  save_ = PendingSave{};
}

Status CudaDeviceSaver::OrderAfterCopies(void* stream) {
  if (!pending_) return Status::Ok();
  const cudaStream_t s = stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
  return Cuda(cudaStreamWaitEvent(s, done_, 0), "ordering a stream after the save's copies");
}

Status CudaDeviceSaver::CopyToDevice(void* dst, const void* src, uint64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  const cudaStream_t s = stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
  // restored_ tracks one stream: a copy on another first fences the last.
  if (restores_pending_ && s != restore_stream_) FTRUN_RETURN_IF_ERROR(FenceRestores());
  const uint64_t offset = static_cast<uint64_t>(static_cast<const char*>(src) - client_->arena.base());
  FTRUN_RETURN_IF_ERROR(arena_->CopyToDevice(dst, offset, n, s));
  FTRUN_RETURN_IF_ERROR(Cuda(cudaEventRecord(restored_, s), "recording a restore copy"));
  restore_stream_ = s;
  restores_pending_ = true;
  return Status::Ok();
}

Status CudaDeviceSaver::FenceRestores() {
  if (!restores_pending_) return Status::Ok();
  restores_pending_ = false;
  return Cuda(cudaEventSynchronize(restored_), "copying restored tensors to the device");
}

}  // namespace

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
