#include "launcher/agent/erasure_member.h"

#include "plugin/common/log.h"

namespace ftrun {

ErasureMember::ErasureMember(Transport* transport, SnapshotStore* store, char* arena_base, PeerAddresses* peers,
                             std::function<std::vector<int>()> ranks,
                             std::function<std::optional<uint64_t>()> committed, const Clock& clock)
    : t_(transport),
      store_(store),
      base_(arena_base),
      peers_(peers),
      ranks_(std::move(ranks)),
      committed_(std::move(committed)),
      clock_(clock) {}

ErasureMember::~ErasureMember() = default;

void ErasureMember::Membership(const MembershipMsg& m) {
  if (m.erasure_data <= 0) return;
  if (!code_ || code_->data() != m.erasure_data || code_->parity() != m.erasure_parity) {
    std::unique_ptr<GroupCode> code;
    if (Status s = GroupCode::Create(m.erasure_data, m.erasure_parity, &code); !s.ok()) {
      FTRUN_LOG_ERROR("the coordinator names an erasure code this agent cannot run: {}", s.message());
      return;
    }
    code_ = std::move(code);
    exchange_ = std::make_unique<ParityExchange>(t_, store_, base_, code_.get(), clock_);
    exchange_->on_complete = [this](uint64_t v) {
      if (on_parity_held) on_parity_held(v);
    };
    exchange_->on_failed = [this](uint64_t v, const Status&) {
      if (on_round_failed) on_round_failed(v);
    };
    server_ = std::make_unique<FragmentServer>(t_, store_, base_, exchange_.get(), ranks_);
    rebuild_ =
        std::make_unique<ErasureRebuild>(t_, store_, base_, code_.get(), [this](PeerId p) { peers_->Connect(p); });
    rebuild_->on_done = [this](uint64_t epoch, uint64_t version, const std::vector<int>& ranks) {
      if (on_rebuilt) on_rebuilt(epoch, version, ranks);
    };
    rebuild_->on_failed = [this](uint64_t epoch, uint64_t version, int rank, const Status& s) {
      if (on_rebuild_failed) on_rebuild_failed(PullFailedMsg{epoch, rank, version, s.message()});
    };
    exchange_->SetEpoch(epoch_);
  }
  std::vector<PeerId> group(m.group.begin(), m.group.end());
  exchange_->SetGroup(group, m.group_member);
  std::vector<PeerId> others;
  for (size_t i = 0; i < group.size(); ++i) {
    if (static_cast<int>(i) != m.group_member && group[i] != kNoAgent) others.push_back(group[i]);
  }
  peers_->Connect(others);
  server_->Regrouped();
}

void ErasureMember::SetEpoch(uint64_t epoch) {
  if (epoch > epoch_) {
    round_.reset();
    round_ranks_.clear();
  }
  epoch_ = std::max(epoch_, epoch);
  if (exchange_) exchange_->SetEpoch(epoch_);
}

void ErasureMember::StartsFrom(uint64_t epoch, std::optional<uint64_t> version) {
  SetEpoch(epoch);
  round_.reset();
  round_ranks_.clear();
  if (exchange_) exchange_->StartsFrom(epoch_, version);
}

void ErasureMember::Saved(int rank, uint64_t version) {
  if (!exchange_) return;
  if (round_ != version) {
    round_ = version;
    round_ranks_.clear();
  }
  round_ranks_.insert(rank);
  const std::vector<int> ranks = ranks_();
  for (int r : ranks) {
    if (!round_ranks_.count(r)) return;  // the rest come with their saves
  }
  std::optional<uint64_t> base = committed_();
  if (base && *base >= version) return;  // (committed meanwhile)
  // Deltas need the base in this node's store: without it (a node that
  // restored from disk another timeline's version), whole fragments.
  for (int r : ranks) {
    if (base && !store_->Find(r, *base)) base.reset();
  }
  if (Status s = exchange_->Contribute(version, base, ranks); !s.ok()) {
    FTRUN_LOG_WARN("the parity of version {} cannot be sent: {}", version, s.message());
    if (on_round_failed) on_round_failed(version);
  }
}

void ErasureMember::Committed(uint64_t version) {
  if (exchange_) exchange_->Committed(version);
}

void ErasureMember::Halted() {
  round_.reset();
  round_ranks_.clear();
  if (exchange_) exchange_->DiscardAbove(committed_());
}

void ErasureMember::Rebuild(const PullMsg& m, std::vector<int> ranks) {
  if (!rebuild_) {
    if (on_rebuild_failed)
      on_rebuild_failed(PullFailedMsg{m.epoch, ranks.front(), m.version, "this agent has no erasure group yet"});
    return;
  }
  rebuild_->Begin(m.epoch, m.version, std::move(ranks), m.group, m.group_member);
}

bool ErasureMember::Handle(PeerId from, uint16_t type, const std::string& payload) {
  if (!exchange_) return false;
  return exchange_->Handle(from, type, payload) || server_->Handle(from, type, payload, clock_.Now()) ||
         rebuild_->Handle(from, type, payload);
}

bool ErasureMember::BulkDone(uint64_t token, const Status& status) {
  if (!exchange_) return false;
  return exchange_->BulkDone(token, status) || server_->BulkDone(token, status) || rebuild_->BulkDone(token, status);
}

void ErasureMember::PeerDown(PeerId peer) {
  if (!exchange_) return;
  exchange_->PeerDown(peer);
  rebuild_->PeerDown(peer);
}

void ErasureMember::Tick(Clock::Time now) {
  if (server_) server_->Tick(now);
  if (rebuild_) rebuild_->Tick(now);
}

}  // namespace ftrun
