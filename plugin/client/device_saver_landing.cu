// CudaDeviceSaver's landing half (see cuda_device_saver.h): the landing
// thread that waits for a save's copies and computes their chunk ids, the
// fence that sends the manifest, and the copies of restores to the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "plugin/client/cuda_device_saver.h"

namespace ftrun {

Status CudaDeviceSaver::Land() {
  FTRUN_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(done_), "copying CUDA chunks into shared memory"));
  copied_ids_.assign(copies_.size(), ChunkHash{});
  // Chunks are taken one at a time from a shared counter, so however many
  // helper threads start, every chunk is hashed once.
  std::atomic<size_t> next{0};
  auto hash_chunks = [this, &next] {
    for (size_t k = next++; k < copies_.size(); k = next++) {
      const Copy& c = copies_[k];
      const uint64_t length = save_.manifest.tensors[c.tensor].chunks[c.chunk].length;
      copied_ids_[k] = HashBytes(client_->arena().base() + c.offset, length);
    }
  };
  std::vector<std::thread> helpers;
  const size_t wanted = std::min<size_t>(hash_threads_, copies_.size());
  for (size_t t = 1; t < wanted; ++t) {
    try {
      helpers.emplace_back(hash_chunks);
    } catch (const std::system_error&) {
      break;  // no more threads: the ones running (and this one) do the rest
    }
  }
  hash_chunks();
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
  const uint64_t offset = static_cast<uint64_t>(static_cast<const char*>(src) - client_->arena().base());
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

}  // namespace ftrun
