// The messages between the members of an erasure-coded group
// (parity_exchange.h): a contributor offers one stripe fragment's deltas of
// one version to a holder of one of that stripe's parity rows; the holder
// posts a receive (kParityWant) or refuses (kParityRefused; need_full when
// it holds no parity of the offer's base, so the contributor sends its
// whole fragment, the delta from zeros); the bytes cross as one bulk
// transfer; the holder answers kParityApplied once they are in its row.
// Decoders check structure and bounds: the other side may be broken.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ftrun/status.h"
#include "plugin/protocol/cluster_messages.h"
#include "plugin/protocol/id_ranges.h"
#include "plugin/store/manifest.h"
#include "plugin/transport/transport.h"

namespace ftrun {

// The ids the erasure parts give their transfers, tags and tokens, each in
// a range of its own (plugin/protocol/id_ranges.h).
inline constexpr uint64_t kParityIdBit = id_ranges::kParity;              // ParityExchange: xfers, tags, tokens
inline constexpr uint64_t kFragmentTokenBit = id_ranges::kFragmentToken;  // FragmentServer: bulk send tokens
inline constexpr uint64_t kRebuildIdBit = id_ranges::kRebuild;            // ErasureRebuild: xfers (= tags = tokens)

// The longest parity row (one slot's row of one stripe) a message may name.
inline constexpr uint64_t kMaxParityRowBytes = 64ull << 30;

struct ParityOfferMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kParityOffer;
  // One offer's bytes at most (a contributor cuts a stripe's deltas into
  // offers no larger): what a holder allocates for one.
  static constexpr uint64_t kMaxBytes = 16ull << 20;

  uint64_t xfer = 0;
  uint64_t epoch = 0;
  uint64_t version = 0;
  std::optional<uint64_t> base;  // the deltas are since this version; none: since zeros
  int32_t stripe = 0;
  int32_t row = 0;                                     // the holder's parity row (its slot) in the stripe
  int32_t fragment = 0;                                // the sender's data fragment in the stripe
  bool last = false;                                   // the sender's last offer for this (version, stripe, row)
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // (offset in the slice, length), ascending, apart

  uint64_t bytes() const;
};

struct ParityWantMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kParityWant;
  uint64_t xfer = 0;
  uint64_t tag = 0;
};

struct ParityRefusedMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kParityRefused;
  uint64_t xfer = 0;
  bool need_full = false;
  std::string message;
};

struct ParityAppliedMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kParityApplied;
  uint64_t xfer = 0;
};

// Sends `m` to `peer` (its struct says its type).
template <class M>
void SendMsg(Transport* t, PeerId peer, const M& m) {
  t->Send(peer, static_cast<uint16_t>(M::kType), Encode(m));
}

// A member's manifests of `version` (its ranks'), sent to every other member
// of its group with its parity deltas: a rebuild of that member needs its
// layout and every chunk's hash.
struct GroupManifestsMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kGroupManifests;
  uint64_t epoch = 0;
  uint64_t version = 0;
  std::vector<Manifest> manifests;
};

// A rebuild asks a survivor for `length` bytes from `offset` of one of its
// fragments of `version` (its data slice `index`, or its parity row in slot
// `index`); the survivor stages them and says so (kFragmentReady), the
// rebuild posts its receive under `tag` and says go (kFragmentGo): a
// receive can only be posted once the connection is up, and the survivor's
// message proves it is. Or (kManifests) it asks for member `index`'s
// manifests, answered with kFragmentManifests.
struct FragmentRequestMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kFragmentRequest;
  // The most bytes one request may ask for (a rebuild's piece): what a
  // survivor allocates for one, checked before it does.
  static constexpr uint64_t kMaxLength = 4ull << 20;
  enum Kind : uint8_t { kData = 0, kParity = 1, kManifests = 2 };
  uint64_t xfer = 0;
  uint64_t epoch = 0;
  uint64_t version = 0;
  uint8_t kind = kData;
  int32_t index = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t tag = 0;
};

// kFragmentReady and kFragmentGo: an xfer only.
template <ClusterMsg T>
struct FragmentStepMsg {
  static constexpr ClusterMsg kType = T;
  uint64_t xfer = 0;
};
using FragmentReadyMsg = FragmentStepMsg<ClusterMsg::kFragmentReady>;
using FragmentGoMsg = FragmentStepMsg<ClusterMsg::kFragmentGo>;
template <ClusterMsg T>
std::string Encode(const FragmentStepMsg<T>& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.xfer);
  return w.Take();
}
template <ClusterMsg T>
Status Decode(const std::string& payload, FragmentStepMsg<T>* m) {
  ByteReader r(payload);
  m->xfer = r.Get<uint64_t>();
  return CheckRead(r, T, payload.size());
}

struct FragmentRefusedMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kFragmentRefused;
  uint64_t xfer = 0;
  std::string message;
};

struct FragmentManifestsMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kFragmentManifests;
  uint64_t xfer = 0;
  std::vector<Manifest> manifests;
};

std::string Encode(const ParityOfferMsg& m);
std::string Encode(const GroupManifestsMsg& m);
std::string Encode(const FragmentRequestMsg& m);
std::string Encode(const FragmentRefusedMsg& m);
std::string Encode(const FragmentManifestsMsg& m);
Status Decode(const std::string& payload, GroupManifestsMsg* m);
Status Decode(const std::string& payload, FragmentRequestMsg* m);
Status Decode(const std::string& payload, FragmentRefusedMsg* m);
Status Decode(const std::string& payload, FragmentManifestsMsg* m);
std::string Encode(const ParityWantMsg& m);
std::string Encode(const ParityRefusedMsg& m);
std::string Encode(const ParityAppliedMsg& m);
// An offer whose extents overlap, go backwards, overflow or add up to more
// than kMaxBytes is Corruption, as is any malformed payload.
Status Decode(const std::string& payload, ParityOfferMsg* m);
Status Decode(const std::string& payload, ParityWantMsg* m);
Status Decode(const std::string& payload, ParityRefusedMsg* m);
Status Decode(const std::string& payload, ParityAppliedMsg* m);

}  // namespace ftrun
