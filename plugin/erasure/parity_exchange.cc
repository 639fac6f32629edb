// ParityExchange, the contributor side: deltas planned, computed and sent.
#include "plugin/erasure/parity_exchange.h"

#include <algorithm>
#include <cstring>

#include "plugin/common/hash.h"
#include "plugin/common/log.h"

namespace ftrun {
namespace {

void Xor(const uint8_t* a, const uint8_t* b, uint8_t* out, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    x ^= y;
    std::memcpy(out + i, &x, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<uint8_t>(a[i] ^ b[i]);
}

}  // namespace

ParityExchange::ParityExchange(Transport* transport, SnapshotStore* store, char* arena_base, const GroupCode* code,
                               const Clock& clock)
    : t_(transport), store_(store), base_(arena_base), code_(code), clock_(clock) {}

void ParityExchange::SetGroup(std::vector<PeerId> members, int self) {
  if (!rows_ || self != self_) rows_ = std::make_unique<ParityRows>(code_, self, store_, base_);
  members_ = std::move(members);
  self_ = self;
  std::vector<uint64_t> lost;
  for (const auto& [version, c] : contributions_) {
    for (const Job& j : c.jobs) {
      if (!j.finished &&
          members_[static_cast<size_t>(
              code_->stripes()[static_cast<size_t>(j.stripe)].parity[static_cast<size_t>(j.row)])] != j.to)
        lost.push_back(version);
    }
  }
  for (uint64_t v : lost) Fail(v, Status::Unavailable("a parity holder left the group"));
}

void ParityExchange::SetEpoch(uint64_t epoch) {
  epoch_ = std::max(epoch_, epoch);
  for (auto it = contributions_.begin(); it != contributions_.end();) {
    if (it->second.epoch >= epoch_) {
      ++it;
      continue;
    }
    for (uint64_t v : it->second.pinned) store_->Unpin(v);
    it = contributions_.erase(it);  // (offers in flight keep their bytes until they end)
  }
}

Status ParityExchange::Prepare(uint64_t version, Contribution* c, const std::vector<int>& ranks) {
  std::vector<const Manifest*> now, before;
  for (int r : ranks) {
    const Manifest* m = store_->Find(r, version);
    if (!m)
      return Status::FailedPrecondition("rank " + std::to_string(r) + "'s version " + std::to_string(version) +
                                        " is not in the store");
    now.push_back(m);
    if (c->base) {
      const Manifest* b = store_->Find(r, *c->base);
      if (!b)
        return Status::FailedPrecondition("rank " + std::to_string(r) + "'s version " + std::to_string(*c->base) +
                                          " (the parity's base) is not in the store");
      before.push_back(b);
    }
  }
  c->now = std::make_unique<NodeShard>(now);
  if (c->base) {
    c->before = std::make_unique<NodeShard>(before);
    if (!c->now->SameLayout(*c->before)) {
      return Status::FailedPrecondition("this node's state changed layout between versions " +
                                        std::to_string(*c->base) + " and " + std::to_string(version));
    }
  }
  c->checked.assign(c->now->chunks().size(), 0);
  return Status::Ok();
}

Status ParityExchange::Contribute(uint64_t version, std::optional<uint64_t> base, const std::vector<int>& ranks) {
  if (self_ < 0) return Status::FailedPrecondition("erasure: this node is in no group yet");
  if (contributions_.count(version)) return Status::Ok();  // under way
  Contribution c;
  c.epoch = epoch_;
  c.base = base;
  c.started = clock_.Now();
  FTRUN_RETURN_IF_ERROR(Prepare(version, &c, ranks));
  // Stripe of slice t: where this member's fragment t goes; each of its rows' holders gets a job.
  const uint64_t slice = c.now->SliceLength(code_->data());
  for (int t = 0; t < code_->data(); ++t) {
    const GroupCode::Place p = code_->Locate(self_, static_cast<uint64_t>(t) * slice, slice);
    const Stripe& s = code_->stripes()[static_cast<size_t>(p.stripe)];
    for (int row = 0; row < code_->parity(); ++row) {
      c.jobs.push_back({members_[static_cast<size_t>(s.parity[static_cast<size_t>(row)])], p.stripe, row, p.fragment});
    }
  }
  c.unfinished = static_cast<int>(c.jobs.size());
  // The manifests go first, to every member: a rebuild of this node needs
  // them, and the deltas behind them on each connection.
  GroupManifestsMsg gm{c.epoch, version, {}};
  for (int r : ranks) gm.manifests.push_back(*store_->Find(r, version));
  const std::string payload = Encode(gm);
  for (size_t m = 0; m < members_.size(); ++m) {
    if (static_cast<int>(m) != self_ && members_[m] != kNoAgent)
      t_->Send(members_[m], static_cast<uint16_t>(GroupManifestsMsg::kType), payload);
  }
  c.pinned.push_back(version);
  if (base) c.pinned.push_back(*base);
  for (uint64_t v : c.pinned) store_->Pin(v);
  contributions_.emplace(version, std::move(c));
  Pump(version);
  return Status::Ok();
}

ParityExchange::Plan* ParityExchange::PlanFor(Contribution& c, int stripe, bool full, Status* error) {
  auto key = std::make_pair(stripe, full);
  auto it = c.plans.find(key);
  if (it != c.plans.end()) return &it->second;
  std::vector<std::vector<DeltaPiece>> by_stripe;
  *error = PlanDeltas(*code_, self_, *c.now, full ? nullptr : c.before.get(), &by_stripe);
  if (!error->ok()) return nullptr;
  for (int s = 0; s < code_->members(); ++s) {  // every stripe's, at once: one pass over the chunks
    Plan plan;
    plan.full = full || !c.before;
    plan.pieces = std::move(by_stripe[static_cast<size_t>(s)]);
    Batch batch;
    uint64_t bytes = 0;
    for (size_t i = 0; i < plan.pieces.size(); ++i) {
      for (uint64_t off = 0; off < plan.pieces[i].length;) {
        const uint64_t n = std::min(plan.pieces[i].length - off, kOfferBytes - bytes);
        batch.push_back({i, off, n});
        bytes += n;
        off += n;
        if (bytes == kOfferBytes) {
          plan.batches.push_back(std::move(batch));
          batch.clear();
          bytes = 0;
        }
      }
    }
    plan.batches.push_back(std::move(batch));  // the last (maybe empty: "no change")
    plan.bytes.resize(plan.batches.size());
    c.plans.emplace(std::make_pair(s, full), std::move(plan));
  }
  return &c.plans.at(key);
}

Status ParityExchange::BatchBytes(Contribution& c, Plan& plan, size_t batch,
                                  std::shared_ptr<std::vector<uint8_t>>* out) {
  if ((*out = plan.bytes[batch].lock())) return Status::Ok();
  uint64_t total = 0;
  for (const Part& p : plan.batches[batch]) total += p.length;
  auto bytes = std::make_shared<std::vector<uint8_t>>(total);
  uint64_t at = 0;
  for (const Part& p : plan.batches[batch]) {
    const DeltaPiece& piece = plan.pieces[p.piece];
    const ChunkRef& now = *c.now->chunks()[piece.chunk].ref;
    const ChunkRef* old = plan.full ? nullptr : c.before->chunks()[piece.chunk].ref;
    // A chunk corrupted in shared memory must not reach the parity: each
    // one read is checked once (bit 1: the new version's, bit 2: the base's).
    uint8_t& checked = c.checked[piece.chunk];
    for (auto [ref, bit] : {std::pair<const ChunkRef*, uint8_t>{&now, 1}, {old, 2}}) {
      if (!ref || (checked & bit)) continue;
      if (HashBytes(base_ + ref->offset, ref->length) != ref->hash) {
        return Status::Corruption("chunk " + ref->hash.ToHex() + " no longer matches its hash in this node's memory");
      }
      checked |= bit;
    }
    const uint8_t* n = reinterpret_cast<const uint8_t*>(base_ + now.offset + piece.chunk_offset + p.offset);
    if (!old) {
      std::memcpy(bytes->data() + at, n, p.length);
    } else {
      Xor(n, reinterpret_cast<const uint8_t*>(base_ + old->offset + piece.chunk_offset + p.offset), bytes->data() + at,
          p.length);
    }
    at += p.length;
  }
  plan.bytes[batch] = bytes;
  *out = std::move(bytes);
  return Status::Ok();
}

void ParityExchange::Pump(uint64_t version) {
  auto it = contributions_.find(version);
  if (it == contributions_.end()) return;
  Contribution& c = it->second;
  for (size_t ji = 0; ji < c.jobs.size(); ++ji) {
    Job& j = c.jobs[ji];
    Status error;
    Plan* plan = PlanFor(c, j.stripe, j.full, &error);
    if (!plan) return Fail(version, error);
    while (!j.finished && j.inflight < kInflight && j.next < plan->batches.size()) {
      const bool last = j.next + 1 == plan->batches.size();
      if (last && j.inflight > 0) break;  // "last" only once every other delta is in
      std::shared_ptr<std::vector<uint8_t>> bytes;
      if (Status s = BatchBytes(c, *plan, j.next, &bytes); !s.ok()) return Fail(version, s);
      ParityOfferMsg m;
      m.xfer = kParityIdBit | next_id_++;
      m.epoch = c.epoch;
      m.version = version;
      m.base = j.full ? std::nullopt : c.base;
      m.stripe = j.stripe;
      m.row = j.row;
      m.fragment = j.fragment;
      m.last = last;
      for (const Part& p : plan->batches[j.next]) {
        const DeltaPiece& piece = plan->pieces[p.piece];
        const uint64_t off = piece.place.offset + p.offset;
        if (!m.extents.empty() && m.extents.back().first + m.extents.back().second == off) {
          m.extents.back().second += p.length;  // adjacent chunks: one extent
        } else {
          m.extents.push_back({off, p.length});
        }
      }
      sent_[m.xfer] = {version, ji, last, j.full, std::move(bytes)};
      j.next++;
      j.inflight++;
      SendMsg(t_, j.to, m);
    }
  }
}

void ParityExchange::Want(PeerId from, const ParityWantMsg& m) {
  auto it = sent_.find(m.xfer);
  if (it == sent_.end()) return;
  auto c = contributions_.find(it->second.version);
  if (c == contributions_.end() || c->second.jobs[it->second.job].to != from) return;
  Sent& s = it->second;
  s.token = kParityIdBit | next_id_++;
  send_tokens_[s.token] = m.xfer;
  t_->SendBulk(from, m.tag, s.bytes->data(), s.bytes->size(), s.token);
}

ParityExchange::Job* ParityExchange::Answered(PeerId from, uint64_t xfer, Sent* out) {
  auto it = sent_.find(xfer);
  if (it == sent_.end()) return nullptr;
  *out = it->second;
  sent_.erase(it);
  auto c = contributions_.find(out->version);
  if (c == contributions_.end() || c->second.jobs[out->job].to != from) return nullptr;
  Job& j = c->second.jobs[out->job];
  j.inflight--;
  return &j;
}

void ParityExchange::Refused(PeerId from, const ParityRefusedMsg& m) {
  Sent s;
  Job* j = Answered(from, m.xfer, &s);
  if (!j) return;
  if (m.need_full && j->full && !s.full) return Pump(s.version);  // a delta offer sent before the switch
  const std::optional<uint64_t> base = contributions_.at(s.version).base;
  if (m.need_full && !j->full && base) {
    // The holder has no parity of our base (a replacement): the whole
    // fragment instead. None of the delta was applied (it was the base it
    // lacked, and it refuses every offer from that base).
    j->full = true;
    j->next = 0;
    stats_.full_restarts++;
    FTRUN_LOG_INFO("agent {} holds no parity of version {}: sending it stripe {}'s fragment whole", from, *base,
                   j->stripe);
    return Pump(s.version);
  }
  Fail(s.version, Status::Unavailable("agent " + std::to_string(from) + " refused the parity of version " +
                                      std::to_string(s.version) + ": " + m.message));
}

void ParityExchange::Applied(PeerId from, const ParityAppliedMsg& m) {
  Sent s;
  Job* jp = Answered(from, m.xfer, &s);
  if (!jp) return;
  Job& j = *jp;
  auto c = contributions_.find(s.version);
  if (s.last) {
    j.finished = true;
    if (--c->second.unfinished == 0) return Finish(s.version);
  }
  Pump(s.version);
}

bool ParityExchange::BulkDone(uint64_t token, const Status& status) {
  if (auto it = send_tokens_.find(token); it != send_tokens_.end()) {
    const uint64_t xfer = it->second;
    send_tokens_.erase(it);
    auto s = sent_.find(xfer);
    if (s == sent_.end()) return true;
    if (status.ok()) {
      stats_.delta_bytes_sent += s->second.bytes->size();
      if (auto c = contributions_.find(s->second.version); c != contributions_.end())
        c->second.bytes_sent += s->second.bytes->size();
      s->second.bytes.reset();  // (the batch's bytes go once every holder has them)
    } else {
      const uint64_t version = s->second.version;
      sent_.erase(s);
      Fail(version, Status::Unavailable("a parity transfer failed: " + status.message()));
    }
    return true;
  }
  auto in = in_.find(token);
  if (in == in_.end()) return false;
  if (status.ok() && in->second.second.offer.epoch >= epoch_) Land(in->second.first, in->second.second);
  in_.erase(in);
  return true;
}

void ParityExchange::Fail(uint64_t version, const Status& why) {
  auto it = contributions_.find(version);
  if (it == contributions_.end()) return;
  for (uint64_t v : it->second.pinned) store_->Unpin(v);
  contributions_.erase(it);
  FTRUN_LOG_WARN("the parity of version {} was not sent: {}", version, why.message());
  if (on_failed) on_failed(version, why);
}

void ParityExchange::Finish(uint64_t version) {
  auto it = contributions_.find(version);
  const Contribution& c = it->second;
  Record rec{version,
             !c.base,
             c.now->size(),
             0,
             c.bytes_sent,
             0,
             std::chrono::duration<double>(clock_.Now() - c.started).count()};
  for (const auto& [key, plan] : c.plans) {
    if (key.second) continue;  // (the plan of its base; not the whole fragments a new holder asked for)
    for (const DeltaPiece& p : plan.pieces) rec.changed_bytes += p.length;
  }
  for (const Job& j : c.jobs) rec.full_holders += j.full ? 1 : 0;
  history_.push_back(rec);
  if (history_.size() > 32) history_.pop_front();
  for (uint64_t v : it->second.pinned) store_->Unpin(v);
  contributions_.erase(it);
  if (on_contributed) on_contributed(version);
}

void ParityExchange::Committed(uint64_t version) {
  if (rows_) rows_->Committed(version);
  manifests_.erase(manifests_.begin(), manifests_.lower_bound(version));
}

void ParityExchange::DiscardAbove(std::optional<uint64_t> version) {
  if (rows_) rows_->DiscardAbove(version);
  manifests_.erase(version ? manifests_.upper_bound(*version) : manifests_.begin(), manifests_.end());
}

void ParityExchange::StartsFrom(uint64_t epoch, std::optional<uint64_t> version) {
  SetEpoch(epoch);
  if (rows_) rows_->StartsFrom(epoch, version);
  manifests_.erase(version ? manifests_.upper_bound(*version) : manifests_.begin(), manifests_.end());
}

const std::vector<Manifest>* ParityExchange::Manifests(uint64_t version, int member) const {
  auto v = manifests_.find(version);
  if (v == manifests_.end()) return nullptr;
  auto m = v->second.find(member);
  return m == v->second.end() ? nullptr : &m->second;
}

int ParityExchange::MemberOf(PeerId peer) const {
  auto it = std::find(members_.begin(), members_.end(), peer);
  return it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
}

void ParityExchange::PeerDown(PeerId peer) {
  std::vector<uint64_t> lost;
  for (const auto& [version, c] : contributions_) {
    for (const Job& j : c.jobs) {
      if (j.to == peer && !j.finished) {
        lost.push_back(version);
        break;
      }
    }
  }
  for (uint64_t v : lost) Fail(v, Status::Unavailable("parity holder agent " + std::to_string(peer) + " is down"));
}

}  // namespace ftrun
