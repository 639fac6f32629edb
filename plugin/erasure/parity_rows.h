// ParityRows: the parity a member of an erasure-coded group holds, version
// by version: in its slot i, parity row i of stripe
// GroupCode::ParityStripes(member)[i] (group_code.h).
//
// A version is built from a base: a complete version this member holds (the
// job's committed one), or zeros. Each of the stripe's `data` contributors
// sends the deltas of its slice since the base (old XOR new; everything,
// from zeros); applying them to a copy of the base's row gives the new
// version's row, because the code is linear. A version is complete once
// every contributor of every held row said it sent all its deltas (Done).
// A rank's data is recoverable at a version only while its group's rows are
// complete there, so the committed version's rows are kept until a newer
// version commits (Committed).
//
// Each version remembers the epoch whose offers built it. A version is one
// timeline's: a newer epoch (a restart, a new coordinator, a go-back to the
// disk) saves the same version number again with other bytes, so what an
// older epoch built of it (complete or half-built) is void, and is replaced
// by the newer epoch's first delta instead of having that delta applied on
// top of it (XOR: a delta applied twice is undone). StartsFrom drops them at
// once, when the agent learns where the new epoch starts.
//
// Rows are kept in blocks of up to kBlock bytes, shared between versions: a
// version copies a block of its base only when a delta touches it, so the
// memory and the work follow the change. A row is as long as the furthest
// byte any contributor wrote (a stripe's fragments may differ in length).
// The blocks are extents of the store's arena (SnapshotStore::AllocateBlock),
// so one budget, store.memory_budget, bounds a node's snapshots and the
// parity it holds: a delta that does not fit is refused, naming it.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "ftrun/status.h"
#include "plugin/erasure/group_code.h"
#include "plugin/protocol/parity_messages.h"
#include "plugin/store/snapshot_store.h"

namespace ftrun {

class ParityRows {
 public:
  static constexpr uint64_t kBlock = 1ull << 20;
  // The longest row a contributor may make (a hostile offer cannot make a
  // member allocate more): 64 GiB, a 256 GiB node shard in 4 slices.
  static constexpr uint64_t kMaxRowBytes = kMaxParityRowBytes;

  // `code` and `store` outlive the rows; `arena_base` is the store's mapping.
  ParityRows(const GroupCode* code, int member, SnapshotStore* store, char* arena_base);

  int slots() const { return code_->parity(); }
  int StripeOf(int slot) const { return code_->ParityStripes(member_)[static_cast<size_t>(slot)]; }

  // Whether `version` may be built from `base` in `epoch` here:
  // FailedPrecondition when the base is not held (nullopt, zeros, always
  // is), another base is already building that version in this epoch, it is
  // complete in this epoch, or a newer epoch built it.
  Status CanBuild(uint64_t version, std::optional<uint64_t> base, uint64_t epoch) const;
  // Applies contributor `at.fragment`'s delta to the row in `slot` of
  // `version` (built from `base` in `epoch`: CanBuild first). InvalidArgument
  // for a slot, fragment or range out of bounds; ResourceExhausted when the
  // store has no room for the blocks it writes.
  Status Apply(uint64_t version, std::optional<uint64_t> base, uint64_t epoch, int slot, const GroupCode::Place& at,
               const uint8_t* delta, uint64_t len);
  // Contributor `fragment` of the row in `slot` sent every delta of
  // `version` in `epoch`. True when that completed the version.
  bool Done(uint64_t version, std::optional<uint64_t> base, uint64_t epoch, int slot, int fragment);

  bool Complete(uint64_t version) const;
  std::optional<uint64_t> NewestComplete() const;
  // The job committed `version`: older versions go (complete or not).
  void Committed(uint64_t version);
  // Versions above `version` go (nullopt: all): a failed generation's.
  void DiscardAbove(std::optional<uint64_t> version);
  // Epoch `epoch` starts from `version` (nullopt: from nothing): the
  // versions above it that older epochs built go.
  void StartsFrom(uint64_t epoch, std::optional<uint64_t> version);
  // The epoch that built `version` (nullopt: not held).
  std::optional<uint64_t> EpochOf(uint64_t version) const;

  // Bytes of a complete version's row in `slot` (zeros past its end).
  Status Read(uint64_t version, int slot, uint64_t offset, uint64_t len, uint8_t* out) const;

  // The distinct blocks held, in bytes (shared blocks counted once).
  uint64_t memory_bytes() const;
  // One version's rows, in bytes (0: not held).
  uint64_t VersionBytes(uint64_t version) const;

 private:
  // An extent of the store's arena, given back when the last version that
  // shares it lets go.
  struct Extent {
    Extent(SnapshotStore* s, uint64_t o, uint64_t n, uint8_t* d) : store(s), offset(o), length(n), data(d) {}
    ~Extent() { store->FreeBlock(offset, length); }
    Extent(const Extent&) = delete;
    Extent& operator=(const Extent&) = delete;
    SnapshotStore* store;
    uint64_t offset, length;
    uint8_t* data;
  };
  using Block = std::shared_ptr<Extent>;
  struct Row {
    std::vector<Block> blocks;
    uint64_t length = 0;
    std::set<int> done;  // contributors finished (building only)
  };
  struct Version {
    std::optional<uint64_t> base;
    uint64_t epoch = 0;
    bool complete = false;
    std::vector<Row> rows;  // by slot
  };

  Version* Building(uint64_t version, std::optional<uint64_t> base, uint64_t epoch);
  // Block b of `row`, owned by it alone and at least `size` bytes (its
  // bytes copied from the one it replaces, zeros past them).
  Status Writable(Row* row, size_t b, uint64_t size, uint8_t** out);

  const GroupCode* code_;
  int member_;
  SnapshotStore* store_;
  char* base_;
  std::map<uint64_t, Version> versions_;
};

}  // namespace ftrun
