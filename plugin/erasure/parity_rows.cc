#include "plugin/erasure/parity_rows.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>

namespace ftrun {
namespace {

std::string BaseName(std::optional<uint64_t> base) { return base ? "version " + std::to_string(*base) : "zeros"; }

}  // namespace

ParityRows::ParityRows(const GroupCode* code, int member, SnapshotStore* store, char* arena_base)
    : code_(code), member_(member), store_(store), base_(arena_base) {}

Status ParityRows::CanBuild(uint64_t version, std::optional<uint64_t> base, uint64_t epoch) const {
  auto it = versions_.find(version);
  if (it != versions_.end() && it->second.epoch > epoch) {
    return Status::FailedPrecondition("parity of version " + std::to_string(version) + " is being built in epoch " +
                                      std::to_string(it->second.epoch) + ", newer than " + std::to_string(epoch));
  }
  if (it != versions_.end() && it->second.epoch == epoch) {
    if (it->second.complete) {
      return Status::FailedPrecondition("parity of version " + std::to_string(version) + " is already complete");
    }
    if (it->second.base != base) {
      return Status::FailedPrecondition("parity of version " + std::to_string(version) + " is being built from " +
                                        BaseName(it->second.base) + ", not " + BaseName(base));
    }
    return Status::Ok();
  }
  if (base) {
    auto b = versions_.find(*base);
    if (b == versions_.end() || !b->second.complete || *base >= version) {
      return Status::FailedPrecondition("no complete parity of " + BaseName(base) + " to build version " +
                                        std::to_string(version) + " from");
    }
  }
  return Status::Ok();
}

ParityRows::Version* ParityRows::Building(uint64_t version, std::optional<uint64_t> base, uint64_t epoch) {
  if (!CanBuild(version, base, epoch).ok()) return nullptr;
  auto it = versions_.find(version);
  if (it != versions_.end() && it->second.epoch == epoch) return &it->second;
  if (it != versions_.end()) versions_.erase(it);  // an older epoch's: void (see the header)
  Version v;
  v.base = base;
  v.epoch = epoch;
  if (base) {
    v.rows = versions_.at(*base).rows;  // the blocks are shared until written
  } else {
    v.rows.resize(static_cast<size_t>(slots()));
  }
  for (Row& r : v.rows) r.done.clear();
  return &versions_.emplace(version, std::move(v)).first->second;
}

// A block grows (up to kBlock) to twice its length at least, so a row
// written in small pieces is copied a few times, not once per piece.
Status ParityRows::Writable(Row* row, size_t b, uint64_t size, uint8_t** out) {
  if (row->blocks.size() <= b) row->blocks.resize(b + 1);
  Block& block = row->blocks[b];
  if (block && block.use_count() == 1 && block->length >= size) {
    *out = block->data;
    return Status::Ok();
  }
  const uint64_t kept = block ? block->length : 0;
  const uint64_t length =
      block && block.use_count() == 1 ? std::min(kBlock, std::max(size, 2 * kept)) : std::max(size, kept);
  uint64_t offset = 0;
  if (Status s = store_->AllocateBlock(length, "erasure parity", &offset); !s.ok()) return s;
  auto fresh = std::make_shared<Extent>(store_, offset, length, reinterpret_cast<uint8_t*>(base_ + offset));
  if (kept) std::memcpy(fresh->data, block->data, kept);
  std::memset(fresh->data + kept, 0, length - kept);
  block = std::move(fresh);
  *out = block->data;
  return Status::Ok();
}

Status ParityRows::Apply(uint64_t version, std::optional<uint64_t> base, uint64_t epoch, int slot,
                         const GroupCode::Place& at, const uint8_t* delta, uint64_t len) {
  if (slot < 0 || slot >= slots())
    return Status::InvalidArgument("parity slot " + std::to_string(slot) + " out of range");
  if (at.fragment < 0 || at.fragment >= code_->data()) {
    return Status::InvalidArgument("data fragment " + std::to_string(at.fragment) + " out of 0.." +
                                   std::to_string(code_->data() - 1));
  }
  if (at.offset > kMaxRowBytes || len > kMaxRowBytes - at.offset) {
    return Status::InvalidArgument("a delta at " + std::to_string(at.offset) + " of " + std::to_string(len) +
                                   " bytes runs past the longest parity row (" + std::to_string(kMaxRowBytes) + ")");
  }
  Version* v = Building(version, base, epoch);
  if (!v) return CanBuild(version, base, epoch);
  Row& row = v->rows[static_cast<size_t>(slot)];
  GroupCode::Place p = at;
  p.stripe = StripeOf(slot);
  for (uint64_t done = 0; done < len;) {
    const uint64_t off = at.offset + done;
    const size_t b = static_cast<size_t>(off / kBlock);
    const uint64_t in = off % kBlock, n = std::min(len - done, kBlock - in);
    uint8_t* out = nullptr;
    if (Status s = Writable(&row, b, in + n, &out); !s.ok()) return s;
    code_->ApplyDelta(p, slot, delta + done, n, out + in);
    done += n;
  }
  row.length = std::max(row.length, at.offset + len);
  return Status::Ok();
}

bool ParityRows::Done(uint64_t version, std::optional<uint64_t> base, uint64_t epoch, int slot, int fragment) {
  Version* v = Building(version, base, epoch);
  if (!v || slot < 0 || slot >= slots()) return false;
  v->rows[static_cast<size_t>(slot)].done.insert(fragment);
  for (const Row& r : v->rows) {
    if (static_cast<int>(r.done.size()) < code_->data()) return false;
  }
  v->complete = true;
  for (Row& r : v->rows) r.done.clear();
  return true;
}

bool ParityRows::Complete(uint64_t version) const {
  auto it = versions_.find(version);
  return it != versions_.end() && it->second.complete;
}

std::optional<uint64_t> ParityRows::NewestComplete() const {
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    if (it->second.complete) return it->first;
  }
  return std::nullopt;
}

void ParityRows::Committed(uint64_t version) { versions_.erase(versions_.begin(), versions_.lower_bound(version)); }

void ParityRows::DiscardAbove(std::optional<uint64_t> version) {
  versions_.erase(version ? versions_.upper_bound(*version) : versions_.begin(), versions_.end());
}

void ParityRows::StartsFrom(uint64_t epoch, std::optional<uint64_t> version) {
  for (auto it = version ? versions_.upper_bound(*version) : versions_.begin(); it != versions_.end();) {
    it = it->second.epoch < epoch ? versions_.erase(it) : std::next(it);
  }
}

std::optional<uint64_t> ParityRows::EpochOf(uint64_t version) const {
  auto it = versions_.find(version);
  if (it == versions_.end()) return std::nullopt;
  return it->second.epoch;
}

Status ParityRows::Read(uint64_t version, int slot, uint64_t offset, uint64_t len, uint8_t* out) const {
  auto it = versions_.find(version);
  if (it == versions_.end() || !it->second.complete) {
    return Status::NotFound("no complete parity of version " + std::to_string(version));
  }
  if (slot < 0 || slot >= slots())
    return Status::InvalidArgument("parity slot " + std::to_string(slot) + " out of range");
  const Row& row = it->second.rows[static_cast<size_t>(slot)];
  for (uint64_t done = 0; done < len;) {  // zeros where no block (or past its end)
    const uint64_t off = offset + done;
    const size_t b = static_cast<size_t>(off / kBlock);
    const uint64_t in = off % kBlock, n = std::min(len - done, kBlock - in);
    uint64_t copied = 0;
    if (b < row.blocks.size() && row.blocks[b] && in < row.blocks[b]->length) {
      copied = std::min<uint64_t>(n, row.blocks[b]->length - in);
      std::memcpy(out + done, row.blocks[b]->data + in, copied);
    }
    std::memset(out + done + copied, 0, n - copied);
    done += n;
  }
  return Status::Ok();
}

uint64_t ParityRows::VersionBytes(uint64_t version) const {
  auto it = versions_.find(version);
  if (it == versions_.end()) return 0;
  uint64_t n = 0;
  for (const Row& r : it->second.rows) {
    for (const Block& b : r.blocks) n += b ? b->length : 0;
  }
  return n;
}

uint64_t ParityRows::memory_bytes() const {
  std::unordered_set<const Extent*> seen;
  uint64_t n = 0;
  for (const auto& [version, v] : versions_) {
    for (const Row& r : v.rows) {
      for (const Block& b : r.blocks) {
        if (b && seen.insert(b.get()).second) n += b->length;
      }
    }
  }
  return n;
}

}  // namespace ftrun
