#include "launcher/agent/corrupt_chunks.h"

#include <algorithm>

#include "plugin/common/bytes.h"
#include "plugin/common/log.h"

namespace ftrun {

CorruptChunks::CorruptChunks(SnapshotStore* store, char* arena_base, Repair repair, std::string repair_from)
    : store_(store), base_(arena_base), repair_(std::move(repair)), repair_from_(std::move(repair_from)) {}

std::string CorruptChunks::Chunk::Name() const {
  return "rank " + std::to_string(rank) + " tensor '" + tensor + "' chunk #" + std::to_string(index) + " of version " +
         std::to_string(version);
}

ChunkHash CorruptChunks::HashAt(const ChunkRef& ref) const { return HashBytes(base_ + ref.offset, ref.length); }

CorruptChunks::Verdict CorruptChunks::Reported(int rank, const CorruptChunkReport& r) {
  Chunk c;
  c.rank = rank;
  c.version = r.version;
  c.tensor = r.tensor;
  c.index = r.index;
  const Manifest* m = store_->Find(rank, r.version);
  const TensorManifest* tm = nullptr;
  for (size_t t = 0; m != nullptr && t < m->tensors.size(); ++t) {
    if (m->tensors[t].info.name == r.tensor) tm = &m->tensors[t];
  }
  if (tm == nullptr || r.index >= tm->chunks.size()) {
    return {false, c.Name() + " is not in this node's store (dropped already)"};
  }
  c.ref = tm->chunks[r.index];
  c.seen = HashAt(c.ref);
  if (c.seen == c.ref.hash) {
    FTRUN_LOG_WARN("{}: rank {} read bytes hashing to {}, but the store's copy checks out", c.Name(), rank,
                   r.seen.ToHex());
    return {false, "the store's copy of it checks out: the read went wrong in the rank"};
  }
  FTRUN_LOG_WARN("{} (store offset {}, {} bytes): its bytes hash to {}, expected {}: corrupted in shared memory",
                 c.Name(), c.ref.offset, c.ref.length, c.seen.ToHex(), c.ref.hash.ToHex());
  Found(std::move(c));
  return {true,
          "confirmed corrupted in shared memory; the restart replaces it from a good copy (a holder or the persist "
          "directory) or stops"};
}

void CorruptChunks::FoundSending(int rank, uint64_t version, const ChunkRef& chunk) {
  Chunk c;
  c.rank = rank;
  c.version = version;
  c.ref = chunk;
  c.seen = HashAt(chunk);
  const Manifest* m = store_->Find(rank, version);
  for (size_t t = 0; m != nullptr && t < m->tensors.size() && c.tensor.empty(); ++t) {
    const auto& chunks = m->tensors[t].chunks;
    for (size_t j = 0; j < chunks.size(); ++j) {
      if (chunks[j].hash != chunk.hash) continue;
      c.tensor = m->tensors[t].info.name;
      c.index = j;
      break;
    }
  }
  FTRUN_LOG_WARN(
      "{} (store offset {}, {} bytes): its bytes hash to {}, expected {}: corrupted in shared memory; not "
      "sent to a peer",
      c.Name(), chunk.offset, chunk.length, c.seen.ToHex(), chunk.hash.ToHex());
  Found(std::move(c));
}

// Counted each time; kept once (two ranks may read the same shared chunk).
void CorruptChunks::Found(Chunk c) {
  ++found_;
  bool known = false;
  for (const Chunk& k : chunks_) known |= k.ref.hash == c.ref.hash && k.ref.offset == c.ref.offset;
  if (!known) chunks_.push_back(std::move(c));
  if (on_change) on_change();
}

void CorruptChunks::Repaired(const Chunk& c, const std::string& from) {
  FTRUN_LOG_WARN("{}: corrupted in shared memory; repaired from {}", c.Name(), from);
  ++repaired_;
  if (on_change) on_change();
}

CorruptChunks::Dropped CorruptChunks::Settle() {
  Dropped out;
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    Chunk& c = *it;
    if (c.dropped) {
      ++it;
      continue;
    }
    // Released meanwhile (nothing references those bytes now), or replaced.
    if (store_->ChunkOffset(c.ref.hash) != c.ref.offset) {
      it = chunks_.erase(it);
      continue;
    }
    if (HashAt(c.ref) == c.ref.hash) {
      FTRUN_LOG_WARN("{}: its bytes check out again; kept", c.Name());
      it = chunks_.erase(it);
      continue;
    }
    if (repair_) {
      Status s = repair_(c.ref, base_ + c.ref.offset);
      if (s.ok()) {
        Repaired(c, repair_from_);
        it = chunks_.erase(it);
        continue;
      }
      FTRUN_LOG_WARN("{}: no good copy in {} ({})", c.Name(), repair_from_, s.message());
    }
    auto gone = store_->DropChunk(c.ref.hash);
    std::string names;
    for (const auto& [rank, version] : gone) {
      names += (names.empty() ? "" : ", ") + std::to_string(rank) + "@" + std::to_string(version);
    }
    FTRUN_LOG_WARN("{}: dropped from the store with the {} snapshot(s) that use it (rank@version: {})", c.Name(),
                   gone.size(), names);
    out.snapshots.insert(out.snapshots.end(), gone.begin(), gone.end());
    if (out.why.empty()) {
      out.why = c.Name() + " is corrupted in shared memory (its bytes hash to " + c.seen.ToHex() + ", expected " +
                c.ref.hash.ToHex() + ")";
    }
    c.dropped = true;
    ++it;
  }
  return out;
}

void CorruptChunks::Pulled(int rank, uint64_t version, const std::string& from) {
  for (auto c = chunks_.begin(); c != chunks_.end();) {
    if (c->dropped && c->rank == rank && c->version == version) {
      Repaired(*c, from);
      c = chunks_.erase(c);
    } else {
      ++c;
    }
  }
}

void CorruptChunks::GiveUpDropped(const std::function<bool(int rank)>& local, std::optional<uint64_t> version) {
  for (const Chunk& c : chunks_) {
    if (c.dropped && local(c.rank)) {
      FTRUN_LOG_WARN("{}: not repaired; the job goes on from version {}", c.Name(), version.value_or(0));
    }
  }
  chunks_.erase(std::remove_if(chunks_.begin(), chunks_.end(), [](const Chunk& c) { return c.dropped; }),
                chunks_.end());
}

}  // namespace ftrun
