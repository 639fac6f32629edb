// CorruptChunks: the chunks of this node's store found corrupted in shared
// memory, and what becomes of each (docs/errors.md).
//
// A chunk is reported by a rank whose load found bytes that do not match
// their hash, or by the replicator about to send it to a peer. A rank's
// report is checked against the agent's own view of the bytes: a rank
// cannot make the agent drop a good copy, and a read that went wrong in the
// rank only changes nothing. When the generation stops (Settle), each chunk
// still bad is repaired in place from a good copy on disk (`Repair`), or
// dropped with every snapshot that uses it, which the coordinator learns
// before it plans the restart: the restart then restores it from a holder's
// copy (Pulled), the disk's, or the job stops naming it.
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ftrun/status.h"
#include "plugin/common/hash.h"
#include "plugin/ipc/rank_messages.h"
#include "plugin/store/snapshot_store.h"

namespace ftrun {

class CorruptChunks {
 public:
  // Rewrites a chunk's bytes at `dst` from a good copy (checked against its
  // hash); an error when there is none.
  using Repair = std::function<Status(const ChunkRef& chunk, char* dst)>;

  // `arena_base`: where the store's offsets point. `repair_from` names the
  // good copy `repair` reads (in log lines); an empty `repair`: none.
  CorruptChunks(SnapshotStore* store, char* arena_base, Repair repair, std::string repair_from);

  // What the agent answers the rank, and whether its copy is bad.
  struct Verdict {
    bool corrupted = false;
    std::string message;
  };
  Verdict Reported(int rank, const CorruptChunkReport& r);
  // The replicator found `chunk` of (rank, version) bad and did not send it.
  void FoundSending(int rank, uint64_t version, const ChunkRef& chunk);

  // The generation stops: each chunk still in the store and still bad is
  // repaired or dropped. Returns the snapshots dropped with them and why
  // (the first chunk's story, named in the job's error if no copy is left).
  struct Dropped {
    std::vector<std::pair<int, uint64_t>> snapshots;  // (rank, version)
    std::string why;
  };
  Dropped Settle();
  // (rank, version) arrived whole from `from` (a pull): its dropped chunks
  // are repaired.
  void Pulled(int rank, uint64_t version, const std::string& from);
  // The job starts again from `version`: what was dropped and not repaired
  // is given up on (logged for `local` ranks).
  void GiveUpDropped(const std::function<bool(int rank)>& local, std::optional<uint64_t> version);

  uint64_t found() const { return found_; }
  uint64_t repaired() const { return repaired_; }
  // Chunks confirmed bad and not settled or repaired yet.
  size_t pending() const { return chunks_.size(); }
  // After each change of found() or repaired() (the agent's status).
  std::function<void()> on_change;

 private:
  struct Chunk {
    int rank = 0;
    uint64_t version = 0;
    std::string tensor;
    uint64_t index = 0;
    ChunkRef ref;              // the store's: hash, length, arena offset
    ChunkHash seen;            // what its bytes hashed to
    bool dropped = false;      // no copy here any more: waiting for a repair
    std::string Name() const;  // "rank R tensor 'T' chunk #i of version V"
  };
  void Found(Chunk c);
  void Repaired(const Chunk& c, const std::string& from);
  ChunkHash HashAt(const ChunkRef& ref) const;

  SnapshotStore* const store_;
  char* const base_;
  const Repair repair_;
  const std::string repair_from_;
  std::vector<Chunk> chunks_;
  uint64_t found_ = 0;
  uint64_t repaired_ = 0;
};

}  // namespace ftrun
