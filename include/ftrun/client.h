// ftrun::Client: a training rank's handle on its node agent's snapshot store.
//
// A rank connects once, then calls Save(version, tensors, user_bytes) every
// step and Load() after a (re)start. Chunk bytes travel through the agent's
// shared memory; only small control messages go over the unix socket.
//
// Thread-safety: a Client is used by one thread at a time (the training
// loop); calls from several threads must be serialized by the caller.
// Ownership: a Snapshot returned by Load keeps its version pinned in the
// store until it is destroyed; it must not outlive its Client.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

enum class DType : uint8_t {
  kUInt8 = 0,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
  kUInt16,
  kUInt32,
  kUInt64,
};
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "float32", "bfloat16", ...
bool ParseDType(std::string_view name, DType* out);

enum class Device : uint8_t { kHost = 0, kCuda = 1 };

// One named, contiguous buffer to save. The bytes must stay valid and
// unmodified until Save returns (host) or until Wait()/the next Save (CUDA).
struct TensorRef {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;  // must equal product(shape) * DTypeSize(dtype)
  Device device = Device::kHost;
  // Optional change hint. 0 means "unknown": every chunk is hashed. A
  // non-zero value equal to the one given for this tensor at the previous
  // Save promises the bytes did not change: its chunks are referenced
  // without being read.
  uint64_t generation = 0;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  Device device = Device::kHost;  // the device it was saved from
};

// How a Save of CUDA tensors is ordered on the GPU (host tensors ignore it).
struct SaveOptions {
  // The cudaStream_t that wrote the tensors and will next overwrite them
  // (PyTorch: torch.cuda.current_stream().cuda_stream); nullptr means the
  // legacy and the per-thread default streams. The copies wait for the
  // stream's work queued before Save; its work queued after Save waits for
  // the copies (a CUDA event: the CPU never blocks on it).
  void* cuda_stream = nullptr;
  // false: the stream's later work does not wait for the copies, so they
  // overlap it (the next forward and backward pass); the caller must order
  // any write to the saved tensors after them with OrderAfterSave (ftrun's
  // Python layer does it before every optimizer step).
  bool order_cuda_stream = true;
};

struct SaveStats {
  uint64_t bytes_total = 0;   // state size
  uint64_t bytes_hashed = 0;  // bytes read to hash (skipped chunks are not)
  uint64_t bytes_copied = 0;  // bytes written into shared memory
  uint64_t chunks_total = 0;
  uint64_t chunks_copied = 0;
  uint64_t chunks_skipped = 0;    // unchanged by generation, never read
  uint64_t chunks_unchanged = 0;  // hashed and found unchanged
  double stall_seconds = 0;       // wall time spent inside Save
};

struct VersionList {
  std::vector<uint64_t> committed;  // ascending
  std::vector<uint64_t> pending;    // this rank's saved, not yet committed
  uint64_t restore_version = 0;     // what a restart restores; see has_restore
  bool has_restore = false;
};

struct ClientOptions {
  std::string socket_path;  // empty: $FTRUN_AGENT_SOCKET
  int rank = -1;            // -1: $FTRUN_RANK, else $RANK
  int connect_timeout_ms = 10000;
  // A writer of the rank, not the rank: another process of the rank's process
  // group (DCP's process checkpointer, dcp.async_save's background process)
  // that saves versions for the rank beside the rank's own connection. It may
  // save and list versions, nothing else.
  bool writer = false;
};

class Client;

// A tensor of a loaded version mapped copy-on-write from the store's shared
// memory (Snapshot::Map): reading it reads the store's pages, nothing is
// copied; writing a page gives this process a private copy of that page, and
// the store never sees the write. Until Detach, unwritten pages still are the
// store's, so the Snapshot it came from must stay open (its version pinned).
class MappedTensor {
 public:
  ~MappedTensor();  // unmaps
  MappedTensor(const MappedTensor&) = delete;
  MappedTensor& operator=(const MappedTensor&) = delete;

  void* data() const { return data_; }
  uint64_t nbytes() const { return nbytes_; }
  bool detached() const { return detached_; }
  // Makes every page private (one copy of each page not written yet), after
  // which the mapping no longer depends on the store and the Snapshot may
  // close. Safe while other threads read or write the bytes.
  Status Detach();

  MappedTensor(void* base, uint64_t span, void* data, uint64_t nbytes);

 private:
  void* base_;  // the mapping: [base_, base_ + span_)
  uint64_t span_;
  void* data_;
  uint64_t nbytes_;
  bool detached_ = false;
};

// A loaded version: its tensors' descriptions and user bytes; Read copies a
// tensor out of shared memory, Map maps it copy-on-write; both check every
// chunk's hash.
class Snapshot {
 public:
  ~Snapshot();
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  uint64_t version() const;
  const std::vector<TensorInfo>& tensors() const;
  const std::string& user_bytes() const;
  // Copies tensor `name` into dst (dst_bytes must equal its nbytes).
  // Returns kCorruption if a chunk's bytes do not match its hash.
  Status Read(std::string_view name, void* dst, uint64_t dst_bytes) const;
  // Makes dst (live memory that may already hold some of the tensor, e.g.
  // a surviving process's parameters) hold tensor `name`: a chunk whose
  // bytes in dst already hash to the saved hash is left as it is, the others
  // are copied as Read does.
  Status Refresh(std::string_view name, void* dst, uint64_t dst_bytes) const;
  // Same, into CUDA memory when built with CUDA (kUnimplemented otherwise).
  // Every chunk's hash is checked on the host first; the copies then go
  // straight from the store (registered with CUDA) to dst, asynchronously
  // on `cuda_stream` (a cudaStream_t; nullptr: the legacy default stream):
  // work queued on that stream afterwards sees the bytes. The Snapshot
  // waits for the copies when it is destroyed (its store extents are
  // released then).
  Status ReadToDevice(std::string_view name, void* dst, uint64_t dst_bytes, void* cuda_stream = nullptr) const;
  // Maps tensor `name` copy-on-write (see MappedTensor), checking every
  // chunk's hash: no copy, so restoring a large state costs page-table
  // updates instead of a copy into fresh memory. kFailedPrecondition when
  // its chunks cannot be mapped as one range (a chunk not page-aligned in
  // the segment): Read it instead. kCorruption as Read.
  Status Map(std::string_view name, std::unique_ptr<MappedTensor>* out) const;

  struct Impl;
  explicit Snapshot(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

class Client {
 public:
  static constexpr uint64_t kLatest = std::numeric_limits<uint64_t>::max();

  // Connects to the agent, receives its shared memory and checks that it
  // belongs to this job.
  static Status Connect(const ClientOptions& options, std::unique_ptr<Client>* out);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  int rank() const;
  const std::string& job_id() const;
  uint64_t chunk_size() const;
  // The version this rank must restore after a restart; false at a fresh start.
  bool restore_version(uint64_t* version) const;

  // Snapshots `tensors` as `version` (strictly greater than this rank's last
  // saved version, and the same tensor set, dtypes and shapes every time).
  // Host tensors: returns once every changed chunk is in shared memory and
  // the agent accepted the manifest. CUDA tensors: returns once the copies
  // are queued; Wait() or the next Save fences them.
  Status Save(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
              SaveStats* stats = nullptr);
  Status Save(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
              const SaveOptions& options, SaveStats* stats = nullptr);
  // Completes the last Save's asynchronous part (CUDA copies, manifest).
  Status Wait();
  // Makes `cuda_stream`'s later work (a cudaStream_t; nullptr: the legacy
  // default stream) wait for the last Save's CUDA copies, without blocking
  // the CPU. A no-op when no copies are in flight.
  Status OrderAfterSave(void* cuda_stream);
  // Blocks until `version` is committed (or a newer one), up to timeout_ms.
  Status WaitCommitted(uint64_t version, int timeout_ms);
  // Opens `version` (kLatest: the last committed version) for reading.
  Status Load(uint64_t version, std::unique_ptr<Snapshot>* out);
  Status ListVersions(VersionList* out);
  // Tells the agent the rank is alive and at `step` (hang detection). Save
  // reports progress too.
  Status ReportProgress(uint64_t step);

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ftrun
