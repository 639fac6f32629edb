// FragmentServer: a survivor's side of an erasure-coded rebuild. A member
// of the group being rebuilt asks (kFragmentRequest) for bytes of one of
// this node's fragments of the committed version: a data slice of this
// node's shard (its ranks' chunks, each checked against its hash before it
// is sent, zeros past the slice's end), a parity row (ParityRows), or the
// lost member's manifests as it sent them before it was lost. The bytes go
// straight into the receive the requester posted; anything this node cannot
// serve is refused, naming why, and the requester asks another survivor.
//
// A request from an agent the membership does not name in this node's
// group (yet: the coordinator's new membership may still be on its way) is
// parked up to kPatience, then refused. Staged bytes whose requester never
// says go are dropped after kPatience too, and the requester is told (it
// asks again or elsewhere, rather than wait for them). A request for more
// than FragmentRequestMsg::kMaxLength is refused before anything is
// allocated, as is one past kMaxParked staged at once: what requesters can
// make a survivor hold is bounded by kMaxParked x kMaxLength.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "plugin/erasure/byte_pool.h"
#include "plugin/erasure/parity_exchange.h"

namespace ftrun {

class FragmentServer {
 public:
  static constexpr auto kPatience = std::chrono::seconds(5);
  static constexpr size_t kMaxParked = 64;

  // `ranks`: this node's ranks now.
  FragmentServer(Transport* transport, SnapshotStore* store, const char* arena_base, const ParityExchange* exchange,
                 std::function<std::vector<int>()> ranks);

  bool Handle(PeerId from, uint16_t type, const std::string& payload, std::chrono::steady_clock::time_point now);
  bool BulkDone(uint64_t token, const Status& status);
  // The group changed: parked requests are served or stay parked.
  void Regrouped();
  void Tick(std::chrono::steady_clock::time_point now);

 private:
  struct Parked {
    PeerId from;
    FragmentRequestMsg m;
    std::chrono::steady_clock::time_point since;
  };
  void Serve(PeerId from, const FragmentRequestMsg& m, std::chrono::steady_clock::time_point now);
  void Go(PeerId from, uint64_t xfer);
  Status DataSlice(const FragmentRequestMsg& m, std::vector<uint8_t>* out) const;
  void Refuse(PeerId to, uint64_t xfer, const std::string& why);

  Transport* t_;
  SnapshotStore* store_;
  const char* base_;
  const ParityExchange* exchange_;
  std::function<std::vector<int>()> ranks_;
  std::deque<Parked> parked_;
  uint64_t next_token_ = 1;
  struct Staged {
    std::vector<uint8_t> bytes;
    uint64_t tag;
    std::chrono::steady_clock::time_point since;
  };
  std::map<std::pair<PeerId, uint64_t>, Staged> staged_;  // (requester, xfer) -> awaiting its go
  std::map<uint64_t, std::vector<uint8_t>> sending_;      // token -> the bytes until the send ends
  BytePool pool_{8};                                      // staging buffers to reuse
};

}  // namespace ftrun
