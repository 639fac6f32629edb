// Client::Impl: the state behind ftrun::Client. Internal to libftrun.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "ftrun/client.h"
#include "plugin/common/fd.h"
#include "plugin/common/hash.h"
#include "plugin/ipc/wire.h"
#include "plugin/store/arena.h"
#include "plugin/store/manifest.h"

namespace ftrun {

class DeviceSaver;

// What the rank last saved (or loaded) of one tensor: lets the next Save
// skip chunks by generation, or hash before copying where a chunk did not
// change last time.
struct CachedTensor {
  uint64_t generation = 0;
  uint64_t nbytes = 0;
  std::vector<ChunkHash> hashes;
  std::vector<bool> changed_last;  // copied at the last save
};

struct Client::Impl {
  ~Impl();

  // Sends a request and waits for `expect` (or kError, returned as Status).
  Status Call(MsgType type, const std::string& payload, MsgType expect, std::string* reply,
              int timeout_ms = -1);
  Status SaveHost(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                  SaveStats* stats, bool retried);
  // Sends a manifest whose new chunks are in shared memory; on success
  // replaces the cache entries of its tensors.
  Status SendManifest(Manifest m, std::vector<CachedTensor> fresh);
  Status CheckTensors(const std::vector<TensorRef>& tensors) const;

  // Constant after Connect.
  UniqueFd sock;
  Arena arena;
  int rank = -1;
  int node = 0;
  std::string job_id;
  uint64_t chunk_size = 0;
  bool has_restore = false;
  uint64_t restore_version = 0;

  std::unordered_map<std::string, CachedTensor> cache;
  std::unique_ptr<DeviceSaver> device;  // created on the first CUDA save
};

struct Snapshot::Impl {
  Client::Impl* client = nullptr;
  Manifest manifest;
  std::vector<TensorInfo> infos;
};

}  // namespace ftrun
