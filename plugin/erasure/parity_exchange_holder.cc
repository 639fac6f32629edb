// ParityExchange, the holder side: offers checked, deltas received and
// applied to this member's parity rows.
#include <algorithm>

#include "plugin/common/log.h"
#include "plugin/erasure/parity_exchange.h"

namespace ftrun {
bool ParityExchange::Handle(PeerId from, uint16_t type, const std::string& payload) {
  auto decoded = [&](auto* m) {
    if (Status s = Decode(payload, m); !s.ok()) {
      FTRUN_LOG_WARN("agent {}: {}", from, s.message());
      return false;
    }
    return true;
  };
  switch (static_cast<ClusterMsg>(type)) {
    case ClusterMsg::kParityOffer: {
      ParityOfferMsg m;
      if (decoded(&m)) Offer(from, std::move(m));
      return true;
    }
    case ClusterMsg::kGroupManifests: {
      GroupManifestsMsg m;
      if (decoded(&m)) GroupManifests(from, std::move(m));
      return true;
    }
    case ClusterMsg::kParityWant: {
      ParityWantMsg m;
      if (decoded(&m)) Want(from, m);
      return true;
    }
    case ClusterMsg::kParityRefused: {
      ParityRefusedMsg m;
      if (decoded(&m)) Refused(from, m);
      return true;
    }
    case ClusterMsg::kParityApplied: {
      ParityAppliedMsg m;
      if (decoded(&m)) Applied(from, m);
      return true;
    }
    default:
      return false;
  }
}

// Who may send what: the agent of the data fragment it names, in a stripe
// whose row it names this member holds, in this epoch or a newer one.
Status ParityExchange::CheckOffer(PeerId from, const ParityOfferMsg& m) const {
  auto member = std::find(members_.begin(), members_.end(), from);
  if (self_ < 0 || member == members_.end()) return Status::FailedPrecondition("not a member of this node's group");
  if (m.epoch < epoch_) {
    return Status::FailedPrecondition("epoch " + std::to_string(m.epoch) + " is over (now " + std::to_string(epoch_) +
                                      ")");
  }
  const int n = code_->members();
  if (m.stripe < 0 || m.stripe >= n || m.row < 0 || m.row >= code_->parity() || rows_->StripeOf(m.row) != m.stripe) {
    return Status::InvalidArgument("this member holds no row " + std::to_string(m.row) + " of stripe " +
                                   std::to_string(m.stripe));
  }
  const Stripe& s = code_->stripes()[static_cast<size_t>(m.stripe)];
  if (m.fragment < 0 || m.fragment >= code_->data() ||
      s.data[static_cast<size_t>(m.fragment)].member != static_cast<int>(member - members_.begin())) {
    return Status::FailedPrecondition("fragment " + std::to_string(m.fragment) + " of stripe " +
                                      std::to_string(m.stripe) + " is not the sender's");
  }
  return Status::Ok();
}

void ParityExchange::Offer(PeerId from, ParityOfferMsg m) {
  if (Status s = CheckOffer(from, m); !s.ok()) {
    FTRUN_LOG_WARN("parity offer from agent {} refused: {}", from, s.message());
    return Reply(from, m.xfer, s);
  }
  if (Status s = rows_->CanBuild(m.version, m.base, m.epoch); !s.ok()) {
    // No parity of the base here (this member is new to the row): the
    // sender's whole fragment instead, unless the version is already under
    // way from another base (then it can only fail).
    const bool need_full = m.base && rows_->CanBuild(m.version, std::nullopt, m.epoch).ok();
    return Reply(from, m.xfer, s, need_full);
  }
  const uint64_t bytes = m.bytes();
  const auto pending = std::count_if(in_.begin(), in_.end(), [&](const auto& i) { return i.second.first == from; });
  if (bytes > 0 && pending >= static_cast<long>(code_->parity()) * kInflight) {
    return Reply(from, m.xfer,
                 Status::ResourceExhausted("agent " + std::to_string(from) + " has " + std::to_string(pending) +
                                           " parity offers in flight here already (at most " +
                                           std::to_string(code_->parity() * kInflight) + ")"));
  }
  if (bytes == 0) {
    In in{std::move(m), {}};
    return Land(from, in);
  }
  const uint64_t tag = kParityIdBit | next_id_++;
  In in{std::move(m), std::vector<uint8_t>(bytes)};
  const uint64_t xfer = in.offer.xfer;
  auto& slot = in_[tag];  // the receive's token is its tag
  slot = {from, std::move(in)};
  t_->PostRecv(from, tag, slot.second.bytes.data(), bytes, tag);
  SendMsg(t_, from, ParityWantMsg{xfer, tag});
}

// Kept for a rebuild of the sender: its manifests of a version, if it is a
// member of this group and they are its version's (the sender's own ranks
// are not checked here: a rebuild checks them against its plan).
void ParityExchange::GroupManifests(PeerId from, GroupManifestsMsg m) {
  const int member = MemberOf(from);
  if (member < 0 || member == self_ || m.epoch < epoch_) {
    FTRUN_LOG_WARN("manifests from agent {} ignored: {}", from,
                   member < 0 ? "not a member of this node's group" : "an old epoch's");
    return;
  }
  for (const Manifest& x : m.manifests) {
    if (x.version != m.version) {
      FTRUN_LOG_WARN("manifests from agent {} ignored: rank {}'s is version {}, not {}", from, x.rank, x.version,
                     m.version);
      return;
    }
  }
  manifests_[m.version][member] = std::move(m.manifests);
  while (manifests_.size() > kMaxManifestVersions) manifests_.erase(std::next(manifests_.begin()));
}

void ParityExchange::Land(PeerId from, In& in) {
  const ParityOfferMsg& m = in.offer;
  uint64_t at = 0;
  for (const auto& [offset, len] : m.extents) {
    GroupCode::Place p;
    p.stripe = m.stripe;
    p.fragment = m.fragment;
    p.offset = offset;
    if (Status s = rows_->Apply(m.version, m.base, m.epoch, m.row, p, in.bytes.data() + at, len); !s.ok()) {
      FTRUN_LOG_ERROR("cannot hold the parity of version {} from agent {}: {}", m.version, from, s.message());
      return Reply(from, m.xfer, s);
    }
    at += len;
  }
  Reply(from, m.xfer, Status::Ok());
  if (m.last && rows_->Done(m.version, m.base, m.epoch, m.row, m.fragment) && on_complete) on_complete(m.version);
}

void ParityExchange::Reply(PeerId to, uint64_t xfer, const Status& refused, bool need_full) {
  if (refused.ok()) return SendMsg(t_, to, ParityAppliedMsg{xfer});
  SendMsg(t_, to, ParityRefusedMsg{xfer, need_full, refused.message()});
}

}  // namespace ftrun
