#include "plugin/store/snapshot_store.h"

#include <unordered_set>

#include "plugin/common/check.h"
#include "plugin/config/units.h"

namespace ftrun {

namespace {

// The arena bytes of a reserved chunk (Reserve refused lengths that do not round).
uint64_t Footprint(uint64_t len) {
  std::optional<uint64_t> r = ExtentAllocator::Rounded(len);
  FTRUN_CHECK(r.has_value());
  return *r;
}

}  // namespace

SnapshotStore::SnapshotStore(uint64_t data_offset, uint64_t data_bytes, std::string budget_field)
    : alloc_(data_offset, data_bytes), budget_field_(std::move(budget_field)) {}

Status SnapshotStore::Reserve(uint64_t owner, const std::vector<uint64_t>& lengths, std::vector<uint64_t>* offsets) {
  offsets->clear();
  offsets->reserve(lengths.size());
  auto& mine = reservations_[owner];
  uint64_t wanted = 0;
  for (uint64_t len : lengths) {
    std::optional<uint64_t> r = ExtentAllocator::Rounded(len);
    if (!r || __builtin_add_overflow(wanted, *r, &wanted)) {
      return Status::InvalidArgument("cannot reserve a chunk of " + std::to_string(len) +
                                     " bytes: larger than any store (a corrupt length?)");
    }
  }
  for (uint64_t len : lengths) {
    auto off = alloc_.Allocate(len);
    if (!off) {
      // Roll back this request only; earlier reservations stay.
      for (size_t i = 0; i < offsets->size(); ++i) {
        alloc_.Free((*offsets)[i], lengths[i]);
        reserved_bytes_ -= Footprint(lengths[i]);
        mine.pop_back();
      }
      offsets->clear();
      return Status::ResourceExhausted("snapshot store full: this save needs " + FormatSize(wanted) +
                                       " of new chunks, " + FormatSize(alloc_.free_bytes()) + " free of " +
                                       FormatSize(alloc_.capacity()) + " (" + std::to_string(versions_.size()) +
                                       " versions held, the last committed one is never evicted); raise " +
                                       budget_field_);
    }
    offsets->push_back(*off);
    mine.push_back({*off, len});
    reserved_bytes_ += Footprint(len);
  }
  return Status::Ok();
}

Status SnapshotStore::AllocateBlock(uint64_t length, const char* what, uint64_t* offset) {
  std::optional<uint64_t> off = ExtentAllocator::Rounded(length) ? alloc_.Allocate(length) : std::nullopt;
  if (!off) {
    return Status::ResourceExhausted("snapshot store full: no room for " + FormatSize(length) + " of " + what + ", " +
                                     FormatSize(alloc_.free_bytes()) + " free of " + FormatSize(alloc_.capacity()) +
                                     " (" + std::to_string(versions_.size()) + " versions held); raise " +
                                     budget_field_);
  }
  *offset = *off;
  block_bytes_ += Footprint(length);
  return Status::Ok();
}

void SnapshotStore::FreeBlock(uint64_t offset, uint64_t length) {
  alloc_.Free(offset, length);
  block_bytes_ -= Footprint(length);
}

bool SnapshotStore::HoldChunk(uint64_t owner, const ChunkHash& hash) {
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return false;
  it->second.refs++;
  holds_[owner].push_back({hash, it->second.offset});
  return true;
}

void SnapshotStore::ReleaseReservations(uint64_t owner) {
  if (auto h = holds_.find(owner); h != holds_.end()) {
    std::vector<std::pair<ChunkHash, uint64_t>> held = std::move(h->second);
    holds_.erase(h);
    for (const auto& [hash, offset] : held) UnrefAt(hash, offset);
  }
  auto it = reservations_.find(owner);
  if (it == reservations_.end()) return;
  for (const auto& r : it->second) {
    alloc_.Free(r.offset, r.length);
    reserved_bytes_ -= Footprint(r.length);
  }
  reservations_.erase(it);
}

Status SnapshotStore::AddManifest(uint64_t owner, Manifest m) {
  const std::string who = "rank " + std::to_string(m.rank) + " version " + std::to_string(m.version);
  if (auto last = LastSaved(m.rank); last && m.version <= *last) {
    return Status::FailedPrecondition(who + ": versions must increase, and this rank already saved version " +
                                      std::to_string(*last));
  }
  if (auto it = layouts_.find(m.rank); it != layouts_.end()) {
    FTRUN_RETURN_IF_ERROR(CheckSameLayout(it->second, m));
  }

  // Validation pass: nothing changes until everything checks out.
  auto& mine = reservations_[owner];
  std::unordered_map<uint64_t, size_t> reserved;  // offset -> index in mine
  for (size_t i = 0; i < mine.size(); ++i) reserved[mine[i].offset] = i;
  std::unordered_map<ChunkHash, uint64_t, ChunkHashHasher> added;  // new in this manifest -> length
  std::unordered_set<uint64_t> used_offsets;
  for (const auto& t : m.tensors) {
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      FTRUN_RETURN_IF_ERROR(CheckChunkLength(who, t, i, kMaxChunkSize));
    }
    for (const auto& c : t.chunks) {
      if (c.offset == kNoOffset) continue;
      auto r = reserved.find(c.offset);
      if (r == reserved.end() || mine[r->second].length != c.length || !used_offsets.insert(c.offset).second) {
        return Status::InvalidArgument(who + ": tensor '" + t.info.name +
                                       "' names a chunk extent this rank did not reserve");
      }
      added.emplace(c.hash, c.length);  // lengths are compared below
    }
  }
  for (const auto& t : m.tensors) {
    for (const auto& c : t.chunks) {
      auto held = chunks_.find(c.hash);
      auto fresh = added.find(c.hash);
      if ((held != chunks_.end() && held->second.length != c.length) ||
          (fresh != added.end() && fresh->second != c.length)) {
        return Status::InvalidArgument(who + ": tensor '" + t.info.name + "' gives chunk " + c.hash.ToHex() +
                                       " a length of " + std::to_string(c.length) +
                                       ", which differs from the chunk already under that hash");
      }
      if (c.offset == kNoOffset && held == chunks_.end() && !added.count(c.hash)) {
        return Status(Code::kChunkMissing, who + ": tensor '" + t.info.name + "' references chunk " + c.hash.ToHex() +
                                               " which the store no longer holds");
      }
    }
  }

  // Mutation pass: new chunks first (so references within the manifest
  // resolve), deduplicating against what the store already holds; a
  // duplicate's extent stays reserved and is freed by ReleaseReservations.
  std::vector<ChunkRef*> by_hash;
  for (auto& t : m.tensors) {
    for (auto& c : t.chunks) {
      if (c.offset == kNoOffset) {
        by_hash.push_back(&c);
        continue;
      }
      auto existing = chunks_.find(c.hash);
      if (existing != chunks_.end()) {
        existing->second.refs++;
        c.offset = existing->second.offset;
        continue;
      }
      chunks_.emplace(c.hash, Chunk{c.offset, c.length, 1});
      mine[reserved.at(c.offset)].length = 0;  // consumed
      reserved_bytes_ -= Footprint(c.length);
    }
  }
  for (ChunkRef* c : by_hash) {
    Chunk& chunk = chunks_.at(c->hash);
    chunk.refs++;
    c->offset = chunk.offset;
  }
  std::vector<Reservation> rest;
  for (const auto& r : mine) {
    if (r.length != 0) rest.push_back(r);
  }
  mine = std::move(rest);

  if (!layouts_.count(m.rank)) {
    Manifest layout;
    layout.rank = m.rank;
    layout.version = m.version;
    for (const auto& t : m.tensors) layout.tensors.push_back({t.info, {}});
    layouts_[m.rank] = std::move(layout);
  }
  int rank = m.rank;
  uint64_t version = m.version;
  versions_[version][rank] = std::move(m);
  return Status::Ok();
}

const Manifest* SnapshotStore::Find(int rank, uint64_t version) const {
  auto v = versions_.find(version);
  if (v == versions_.end()) return nullptr;
  auto r = v->second.find(rank);
  return r == v->second.end() ? nullptr : &r->second;
}

std::optional<uint64_t> SnapshotStore::ChunkOffset(const ChunkHash& hash) const {
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return std::nullopt;
  return it->second.offset;
}

std::vector<uint64_t> SnapshotStore::Versions() const {
  std::vector<uint64_t> out;
  for (const auto& [v, ranks] : versions_) out.push_back(v);
  return out;
}

std::vector<uint64_t> SnapshotStore::RankVersions(int rank) const {
  std::vector<uint64_t> out;
  for (const auto& [v, ranks] : versions_) {
    if (ranks.count(rank)) out.push_back(v);
  }
  return out;
}

std::vector<int> SnapshotStore::RanksAt(uint64_t version) const {
  std::vector<int> out;
  auto it = versions_.find(version);
  if (it != versions_.end()) {
    for (const auto& [rank, m] : it->second) out.push_back(rank);
  }
  return out;
}

std::optional<uint64_t> SnapshotStore::LastSaved(int rank) const {
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    if (it->second.count(rank)) return it->first;
  }
  return std::nullopt;
}

void SnapshotStore::Unref(const ChunkHash& hash) {
  auto it = chunks_.find(hash);
  FTRUN_CHECK(it != chunks_.end() && it->second.refs > 0);
  if (--it->second.refs == 0) {
    alloc_.Free(it->second.offset, it->second.length);
    chunks_.erase(it);
  }
}

void SnapshotStore::UnrefAt(const ChunkHash& hash, uint64_t offset) {
  auto bad = condemned_.find(offset);
  if (bad == condemned_.end()) return Unref(hash);
  FTRUN_CHECK(bad->second.refs > 0);
  if (--bad->second.refs == 0) {
    alloc_.Free(offset, bad->second.length);
    condemned_.erase(bad);
  }
}

void SnapshotStore::UnrefManifest(const Manifest& m) {
  for (const auto& t : m.tensors) {
    for (const auto& c : t.chunks) UnrefAt(c.hash, c.offset);
  }
}

void SnapshotStore::ReleaseVersion(uint64_t version) {
  auto v = versions_.find(version);
  if (v == versions_.end()) return;
  for (const auto& [rank, m] : v->second) UnrefManifest(m);
  versions_.erase(v);
}

std::vector<std::pair<int, uint64_t>> SnapshotStore::DropChunk(const ChunkHash& hash) {
  std::vector<std::pair<int, uint64_t>> dropped;
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return dropped;
  const uint64_t offset = it->second.offset;
  condemned_[offset] = it->second;  // its references now end there
  chunks_.erase(it);
  auto uses = [&](const Manifest& m) {
    for (const auto& t : m.tensors) {
      for (const auto& c : t.chunks) {
        if (c.hash == hash) return true;
      }
    }
    return false;
  };
  for (auto v = versions_.begin(); v != versions_.end();) {
    const uint64_t version = v->first;
    for (auto r = v->second.begin(); r != v->second.end();) {
      if (!uses(r->second)) {
        ++r;
        continue;
      }
      dropped.push_back({r->first, version});
      auto node = v->second.extract(r++);
      if (pins_.count(version))
        dropped_[version].push_back(std::move(node));
      else
        UnrefManifest(node.mapped());
    }
    v = v->second.empty() ? versions_.erase(v) : std::next(v);
  }
  return dropped;
}

void SnapshotStore::ReleaseBelow(uint64_t version) {
  release_floor_ = std::max(release_floor_, version);
  std::vector<uint64_t> drop;
  for (const auto& [v, ranks] : versions_) {
    if (v >= version) break;
    if (!pins_.count(v)) drop.push_back(v);
  }
  for (uint64_t v : drop) ReleaseVersion(v);
}

void SnapshotStore::ReleaseBetween(std::optional<uint64_t> low, uint64_t high) {
  std::vector<uint64_t> drop;
  for (const auto& [v, ranks] : versions_) {
    if (v >= high) break;
    if ((!low || v > *low) && !pins_.count(v)) drop.push_back(v);
  }
  for (uint64_t v : drop) ReleaseVersion(v);
}

void SnapshotStore::DiscardAbove(std::optional<uint64_t> version) {
  // Going back below the floor (a job restored from an older version on
  // disk): versions at or under `version` are live again, not releasable.
  release_floor_ = version ? std::min(release_floor_, *version) : 0;
  std::vector<uint64_t> drop;
  for (const auto& [v, ranks] : versions_) {
    if (!version || v > *version) drop.push_back(v);
  }
  for (uint64_t v : drop) ReleaseVersion(v);
}

void SnapshotStore::Pin(uint64_t version) { pins_[version]++; }

void SnapshotStore::Unpin(uint64_t version) {
  auto it = pins_.find(version);
  if (it == pins_.end()) return;
  if (--it->second == 0) {
    pins_.erase(it);
    if (auto d = dropped_.find(version); d != dropped_.end()) {
      for (const auto& node : d->second) UnrefManifest(node.mapped());
      dropped_.erase(d);
    }
    if (version < release_floor_) ReleaseVersion(version);
  }
}

StoreStats SnapshotStore::Stats() const {
  StoreStats s;
  s.capacity_bytes = alloc_.capacity();
  s.used_bytes = alloc_.used();
  s.reserved_bytes = reserved_bytes_;
  s.block_bytes = block_bytes_;
  s.chunks = chunks_.size();
  s.versions = versions_.size();
  return s;
}

}  // namespace ftrun
