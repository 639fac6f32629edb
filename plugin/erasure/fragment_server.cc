#include "plugin/erasure/fragment_server.h"

#include <algorithm>
#include <cstring>

#include "plugin/common/hash.h"
#include "plugin/common/log.h"

namespace ftrun {
FragmentServer::FragmentServer(Transport* transport, SnapshotStore* store, const char* arena_base,
                               const ParityExchange* exchange, std::function<std::vector<int>()> ranks)
    : t_(transport), store_(store), base_(arena_base), exchange_(exchange), ranks_(std::move(ranks)) {}

bool FragmentServer::Handle(PeerId from, uint16_t type, const std::string& payload,
                            std::chrono::steady_clock::time_point now) {
  if (static_cast<ClusterMsg>(type) == ClusterMsg::kFragmentGo) {
    FragmentGoMsg m;
    if (Decode(payload, &m).ok()) Go(from, m.xfer);
    return true;
  }
  if (static_cast<ClusterMsg>(type) != ClusterMsg::kFragmentRequest) return false;
  FragmentRequestMsg m;
  if (Status s = Decode(payload, &m); !s.ok()) {
    FTRUN_LOG_WARN("agent {}: {}", from, s.message());
    return true;
  }
  if (exchange_->MemberOf(from) < 0) {
    if (parked_.size() >= kMaxParked) {
      Refuse(from, m.xfer, "not a member of this node's erasure group");
    } else {
      parked_.push_back({from, m, now});
    }
    return true;
  }
  Serve(from, m, now);
  return true;
}

void FragmentServer::Regrouped() {
  std::deque<Parked> still;
  for (Parked& p : parked_) {
    if (exchange_->MemberOf(p.from) < 0)
      still.push_back(std::move(p));
    else
      Serve(p.from, p.m, p.since);
  }
  parked_ = std::move(still);
}

void FragmentServer::Tick(std::chrono::steady_clock::time_point now) {
  while (!parked_.empty() && now - parked_.front().since > kPatience) {
    Refuse(parked_.front().from, parked_.front().m.xfer, "not a member of this node's erasure group");
    parked_.pop_front();
  }
  for (auto it = staged_.begin(); it != staged_.end();) {
    if (now - it->second.since <= kPatience) {
      ++it;
      continue;
    }
    Refuse(it->first.first, it->first.second, "the fragment was staged here but not fetched within 5 s");
    pool_.Give(std::move(it->second.bytes));
    it = staged_.erase(it);
  }
}

void FragmentServer::Serve(PeerId from, const FragmentRequestMsg& m, std::chrono::steady_clock::time_point now) {
  if (m.epoch < exchange_->epoch()) return Refuse(from, m.xfer, "a request of an older epoch");
  if (m.kind == FragmentRequestMsg::kManifests) {
    const std::vector<Manifest>* v = exchange_->Manifests(m.version, m.index);
    if (!v) {
      return Refuse(from, m.xfer,
                    "no manifests of member " + std::to_string(m.index) + " at version " + std::to_string(m.version));
    }
    return SendMsg(t_, from, FragmentManifestsMsg{m.xfer, *v});
  }
  if (m.length > FragmentRequestMsg::kMaxLength) {
    return Refuse(from, m.xfer,
                  "a request for " + std::to_string(m.length) + " bytes (at most " +
                      std::to_string(FragmentRequestMsg::kMaxLength) + " per request)");
  }
  if (staged_.size() >= kMaxParked) return Refuse(from, m.xfer, "too many fragments staged here; ask again");
  std::vector<uint8_t> bytes = pool_.Take(m.length);
  Status s;
  if (m.kind == FragmentRequestMsg::kParity) {
    s = m.index < exchange_->rows().slots()
            ? exchange_->rows().Read(m.version, m.index, m.offset, m.length, bytes.data())
            : Status::InvalidArgument("no parity slot " + std::to_string(m.index));
  } else {
    s = DataSlice(m, &bytes);
  }
  if (!s.ok()) {
    pool_.Give(std::move(bytes));
    return Refuse(from, m.xfer, s.message());
  }
  staged_[{from, m.xfer}] = {std::move(bytes), m.tag, now};
  SendMsg(t_, from, FragmentReadyMsg{m.xfer});
}

void FragmentServer::Go(PeerId from, uint64_t xfer) {
  auto it = staged_.find({from, xfer});
  if (it == staged_.end()) return;
  const uint64_t token = kFragmentTokenBit | next_token_++;
  auto& kept = sending_[token];
  kept = std::move(it->second.bytes);
  const uint64_t tag = it->second.tag;
  staged_.erase(it);
  t_->SendBulk(from, tag, kept.data(), kept.size(), token);
}

// Bytes [offset, offset + length) of slice m.index of this node's shard at
// m.version, zeros past the slice's (or the shard's) end; every chunk read
// checked against its hash first.
Status FragmentServer::DataSlice(const FragmentRequestMsg& m, std::vector<uint8_t>* out) const {
  const int data = exchange_->code().data();
  if (m.index >= data) return Status::InvalidArgument("no data slice " + std::to_string(m.index));
  std::vector<const Manifest*> mine;
  for (int r : ranks_()) {
    const Manifest* x = store_->Find(r, m.version);
    if (!x)
      return Status::NotFound("rank " + std::to_string(r) + " has no version " + std::to_string(m.version) + " here");
    mine.push_back(x);
  }
  const NodeShard shard(mine);
  const uint64_t slice = shard.SliceLength(data);
  const uint64_t from = static_cast<uint64_t>(m.index) * slice + std::min(m.offset, slice);
  const uint64_t to =
      std::min({static_cast<uint64_t>(m.index) * slice + std::min(m.offset + m.length, slice), shard.size()});
  const uint64_t filled = to > from ? to - from : 0;
  std::memset(out->data() + filled, 0, out->size() - filled);
  for (const NodeShard::Chunk& c : shard.chunks()) {
    const uint64_t a = std::max(from, c.at), b = std::min(to, c.at + c.ref->length);
    if (a >= b) continue;
    if (HashBytes(base_ + c.ref->offset, c.ref->length) != c.ref->hash) {
      return Status::Corruption("chunk " + c.ref->hash.ToHex() + " no longer matches its hash on this node");
    }
    std::memcpy(out->data() + (a - from), base_ + c.ref->offset + (a - c.at), b - a);
  }
  return Status::Ok();
}

bool FragmentServer::BulkDone(uint64_t token, const Status& status) {
  auto it = sending_.find(token);
  if (it == sending_.end()) return false;
  if (!status.ok()) FTRUN_LOG_WARN("a fragment for a rebuild was not sent: {}", status.message());
  pool_.Give(std::move(it->second));
  sending_.erase(it);
  return true;
}

void FragmentServer::Refuse(PeerId to, uint64_t xfer, const std::string& why) {
  SendMsg(t_, to, FragmentRefusedMsg{xfer, why});
}

}  // namespace ftrun
