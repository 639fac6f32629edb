// A chunk a rank found corrupted in the store: the agent checks its own copy, drops what uses it and
// replaces it from the persist directory or a holder before the restart (docs/errors.md).
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>

#include "launcher/agent/agent.h"
#include "launcher/agent/rank_env.h"
#include "launcher/common/disk_worker.h"
#include "plugin/common/bytes.h"
#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "plugin/common/safe_dir.h"
#include "plugin/config/units.h"
#include "plugin/ipc/unix_socket.h"

namespace ftrun {

std::string Agent::CorruptChunk::Name() const {
  return "rank " + std::to_string(rank) + " tensor '" + tensor + "' chunk #" + std::to_string(index) + " of version " +
         std::to_string(version);
}

// The rank's report is checked against the agent's own view of the bytes: a
// rank cannot make the agent drop a good copy, and a read that went wrong in
// the rank only (not in the store) changes nothing.
void Agent::CorruptChunkReported(Connection& conn, const std::string& payload) {
  ByteReader r(payload);
  CorruptChunk c;
  c.rank = conn.rank;
  c.version = r.Get<uint64_t>();
  c.tensor = r.GetString();
  c.index = r.Get<uint64_t>();
  ChunkHash rank_saw;
  rank_saw.lo = r.Get<uint64_t>();
  rank_saw.hi = r.Get<uint64_t>();
  if (!r.ok() || !r.done()) {
    (void)conn.SendError(Status::Corruption("malformed corrupted-chunk report"));
    return;
  }
  const Manifest* m = store_->Find(c.rank, c.version);
  const TensorManifest* tm = nullptr;
  for (size_t t = 0; m != nullptr && t < m->tensors.size(); ++t) {
    if (m->tensors[t].info.name == c.tensor) tm = &m->tensors[t];
  }
  if (tm == nullptr || c.index >= tm->chunks.size()) {
    (void)conn.Send(MsgType::kCorruptChunkOk, c.Name() + " is not in this node's store (dropped already)");
    return;
  }
  c.ref = tm->chunks[c.index];
  c.seen = HashBytes(arena_.base() + c.ref.offset, c.ref.length);
  if (c.seen == c.ref.hash) {
    FTRUN_LOG_WARN("{}: rank {} read bytes hashing to {}, but the store's copy checks out", c.Name(), c.rank,
                   rank_saw.ToHex());
    (void)conn.Send(MsgType::kCorruptChunkOk, "the store's copy of it checks out: the read went wrong in the rank");
    return;
  }
  FTRUN_LOG_WARN("{} (store offset {}, {} bytes): its bytes hash to {}, expected {}: corrupted in shared memory",
                 c.Name(), c.ref.offset, c.ref.length, c.seen.ToHex(), c.ref.hash.ToHex());
  chunks_corrupt_found_++;
  status_dirty_ = true;
  bool known = false;
  for (const CorruptChunk& k : corrupt_) known |= k.ref.hash == c.ref.hash && k.ref.offset == c.ref.offset;
  if (!known) corrupt_.push_back(c);
  (void)conn.Send(MsgType::kCorruptChunkOk,
                  "confirmed corrupted in shared memory; the restart replaces it from a "
                  "good copy (a holder or the persist directory) or stops");
}

// The generation stops: each reported chunk still in the store, still bad,
// is repaired from disk or dropped (with every manifest that uses it, which
// the coordinator learns before it plans the restart).
void Agent::SettleCorruptChunks() {
  std::vector<std::pair<int, uint64_t>> dropped;
  std::string why;  // the first chunk dropped: named in the job's error if no good copy is left
  for (auto it = corrupt_.begin(); it != corrupt_.end();) {
    CorruptChunk& c = *it;
    if (c.dropped) {
      ++it;
      continue;
    }
    // Released meanwhile (nothing references those bytes now), or replaced.
    if (store_->ChunkOffset(c.ref.hash) != c.ref.offset) {
      it = corrupt_.erase(it);
      continue;
    }
    if (HashBytes(arena_.base() + c.ref.offset, c.ref.length) == c.ref.hash) {
      FTRUN_LOG_WARN("{}: its bytes check out again; kept", c.Name());
      it = corrupt_.erase(it);
      continue;
    }
    if (RepairChunkFromDisk(c)) {
      CorruptRepaired(c, "the persist directory (" + o_.config.persist.dir + ")");
      it = corrupt_.erase(it);
      continue;
    }
    auto gone = store_->DropChunk(c.ref.hash);
    std::string names;
    for (const auto& [rank, version] : gone) {
      names += (names.empty() ? "" : ", ") + std::to_string(rank) + "@" + std::to_string(version);
    }
    FTRUN_LOG_WARN("{}: dropped from the store with the {} snapshot(s) that use it (rank@version: {})", c.Name(),
                   gone.size(), names);
    dropped.insert(dropped.end(), gone.begin(), gone.end());
    if (why.empty()) {
      why = c.Name() + " is corrupted in shared memory (its bytes hash to " + c.seen.ToHex() + ", expected " +
            c.ref.hash.ToHex() + ")";
    }
    c.dropped = true;
    ++it;
  }
  if (dropped.empty()) return;
  status_dirty_ = true;
  Report(DroppedMsg{epoch_, dropped, why});
}

void Agent::CorruptRepaired(const CorruptChunk& c, const std::string& from) {
  FTRUN_LOG_WARN("{}: corrupted in shared memory; repaired from {}", c.Name(), from);
  chunks_corrupt_repaired_++;
  status_dirty_ = true;
}

}  // namespace ftrun
