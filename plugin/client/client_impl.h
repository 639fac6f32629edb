// Client::Impl: the state behind ftrun::Client. Internal to libftrun.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ftrun/client.h"
#include "plugin/common/fd.h"
#include "plugin/common/hash.h"
#include "plugin/ipc/wire.h"
#include "plugin/store/arena.h"
#include "plugin/store/manifest.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

namespace ftrun {

class DeviceSaver;

// madvise(advice) over the pages that hold [p, p + n). Best effort where
// used for speed: older kernels, or memory that cannot be populated, simply
// fault on first touch instead.
inline int PopulateRange(void* p, uint64_t n, int advice) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto begin = reinterpret_cast<uintptr_t>(p) / page * page;
  auto end = reinterpret_cast<uintptr_t>(p) + n;
  return n > 0 ? ::madvise(reinterpret_cast<void*>(begin), end - begin, advice) : 0;
}

// What the rank last saved (or loaded) of one tensor: lets the next Save
// skip chunks by generation, or hash before copying where a chunk did not
// change last time.
struct CachedTensor {
  uint64_t generation = 0;
  uint64_t nbytes = 0;
  std::vector<ChunkHash> hashes;
  std::vector<bool> changed_last;  // copied at the last save
};

// A save whose manifest is being built (host chunks staged now, device
// chunks when their copies land).
struct PendingSave {
  Manifest manifest;
  std::vector<CachedTensor> fresh;  // cache entries once the save is accepted
  SaveStats stats;
  bool reserved = false;  // a reservation was made for this attempt
};

struct Client::Impl {
  ~Impl();

  // Sends a request and waits for `expect` (or kError, returned as Status).
  // After a transport failure every later call fails with it (`broken`).
  Status Call(MsgType type, const std::string& payload, MsgType expect, std::string* reply, int timeout_ms = -1);
  // Sends a request that has no reply.
  Status Notify(MsgType type, const std::string& payload);
  // The host save path (save.cc), also the building blocks of the CUDA one.
  Status SaveHost(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                  SaveStats* stats, bool retried);
  // Makes every cached chunk "unchanged last time", so the next save hashes
  // before copying and reserves room only for chunks that really changed
  // (the retry after kResourceExhausted).
  void ForgetChangeHistory();
  // The cache entry for t, if it describes the same size and chunking.
  const CachedTensor* Cached(const TensorRef& t) const;
  // Sizes p's manifest and cache entries for every tensor (chunk lengths
  // set, hashes and offsets not yet).
  void BeginSave(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                 PendingSave* p) const;
  // Reserves one store extent per length for p (kResourceExhausted when
  // full). The first reservation of a save attempt tells the agent to drop
  // whatever an abandoned attempt still holds.
  Status Reserve(PendingSave* p, const std::vector<uint64_t>& lengths, std::vector<uint64_t>* offsets);
  // Fills p's chunks of every host tensor: skipped by generation, found
  // unchanged by hash, or copied into a reserved extent.
  Status StageHost(const std::vector<TensorRef>& tensors, PendingSave* p);
  // Sends p's manifest (every chunk's hash set, new chunks in shared
  // memory); on success the cache describes this save.
  Status SendManifest(PendingSave* p);
  Status CheckTensors(const std::vector<TensorRef>& tensors) const;

  // Constant after Connect.
  UniqueFd sock;
  std::shared_ptr<const Arena> segment;  // this process's mapping of the store (attached_segment.h)
  const Arena& arena() const { return *segment; }
  int rank = -1;
  int node = 0;
  std::string job_id;
  uint64_t chunk_size = 0;
  bool has_restore = false;
  uint64_t restore_version = 0;

  Status broken;  // the first transport failure; sticks
  std::unordered_map<std::string, CachedTensor> cache;
  // Declared after `arena`: it must be destroyed (its copies fenced, the
  // registration undone) before the arena is unmapped.
  std::unique_ptr<DeviceSaver> device;  // created on the first CUDA save
};

struct Snapshot::Impl {
  // Tensor `name` of the manifest, and "version V tensor 'name'" for errors.
  Status Find(std::string_view name, const TensorManifest** tm, std::string* where) const;
  // Find, and kInvalidArgument unless the tensor is dst_bytes long.
  Status FindSized(std::string_view name, uint64_t dst_bytes, const TensorManifest** tm, std::string* where) const;
  // kCorruption when chunk j of a tensor lies outside the store segment.
  Status CheckBounds(const ChunkRef& c, size_t j, const std::string& where) const;
  // kCorruption naming the chunk when its bytes hash to `got`, not c.hash.
  static Status HashMismatch(const ChunkRef& c, size_t j, const ChunkHash& got, const std::string& where);
  // Chunk j of tm hashed to `got`: reports it to the agent (which checks its
  // copy and replaces it from a good one before the ranks restart) and
  // returns the kCorruption error, with what the agent said.
  Status Corrupted(const TensorManifest& tm, size_t j, const ChunkHash& got, const std::string& where) const;
  // Tells the client what was restored, so its next Save hash-compares
  // against it instead of copying every chunk.
  void Remember(const TensorManifest& tm, std::vector<ChunkHash> hashes) const;

  Client::Impl* client = nullptr;
  Manifest manifest;
  std::vector<TensorInfo> infos;
  bool device_reads = false;  // ReadToDevice queued copies (fenced at destruction)
};

}  // namespace ftrun
