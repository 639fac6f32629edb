// Replicator, holder side: copies into this agent's store (routine copies
// offered by the nodes whose copies it keeps, pulls it asked for) and the
// pulls it serves, each only from a peer whose role the membership names
// (PeerRoles).
#include <algorithm>

#include "plugin/common/bytes.h"
#include "plugin/common/hash.h"
#include "plugin/common/log.h"
#include "plugin/replication/replicator.h"
#include "plugin/replication/replicator_wire.h"

namespace ftrun {

using namespace replicator_wire;

void Replicator::Offer(PeerId from, ByteReader* r) {
  uint64_t xfer = r->Get<uint64_t>();
  uint64_t epoch = r->Get<uint64_t>();
  Manifest m;
  Status s = DecodeManifest(r, "offer from agent " + std::to_string(from), &m);
  if (s.ok() && !r->done()) s = Status::Corruption("offer from agent " + std::to_string(from) + ": trailing bytes");
  if (s.ok() && epoch < epoch_ && !(xfer & kPullBit)) {
    s = Status::FailedPrecondition("offer from epoch " + std::to_string(epoch) + ", this agent is at " +
                                   std::to_string(epoch_));
  }
  if (s.ok() && !(xfer & kPullBit)) {
    s = roles_.MayOffer(from, m.rank);
    if (!s.ok()) {
      FTRUN_LOG_WARN("refused a copy of rank {} version {} from agent {}: {}", m.rank, m.version, from, s.message());
    }
  }
  bool stale_pull = false;
  if (s.ok() && (xfer & kPullBit)) {
    // Ours only if asked for in this epoch: a pull asked before a recovery
    // (or before the job went back to the disk) may be of a version, or a
    // timeline, the job no longer restores.
    auto p = pulls_.find(xfer);
    if (p == pulls_.end() || p->second.from != from || p->second.epoch < epoch_) {
      stale_pull = p != pulls_.end() && p->second.from == from;
      s = Status::FailedPrecondition("a pull this agent asked for in an earlier epoch (it is at " +
                                     std::to_string(epoch_) + ")");
    }
  }
  if (s.ok() && in_.count({from, xfer})) s = Status::AlreadyExists("transfer already in progress");
  if (!s.ok()) {
    Reply(from, T(ClusterMsg::kOfferFailed), xfer, s.message());
    if (stale_pull) PullDone(xfer, from, s);
    return;
  }
  const int rank = m.rank;
  const uint64_t version = m.version;
  if (store_->Find(rank, version) != nullptr) {  // already here (e.g. an earlier pull of it finished)
    Reply(from, T(ClusterMsg::kStored), xfer);
    if (on_stored) on_stored(rank, version);
    return PullDone(xfer, from, Status::Ok());
  }
  In& in = in_[{from, xfer}];
  in.from = from;
  in.xfer = xfer;
  in.epoch = epoch;
  in.manifest = std::move(m);
  in.owner = kOwnerBase + next_owner_++;
  in.progress = clock_.Now();
  // Which chunks do we lack? Each distinct missing hash is received once.
  std::vector<ChunkRef*> want;
  std::vector<uint64_t> lengths;
  std::vector<size_t> index;
  std::set<std::pair<uint64_t, uint64_t>> seen;
  size_t i = 0;
  for (auto& t : in.manifest.tensors) {
    for (size_t k = 0; k < t.chunks.size(); ++k) {
      ChunkRef& c = t.chunks[k];
      c.offset = kNoOffset;
      if (Status bad = CheckChunkLength("offer", t, k, chunk_size_); !bad.ok()) {
        store_->ReleaseReservations(in.owner);  // the holds taken so far
        in_.erase({from, xfer});
        return Reply(from, T(ClusterMsg::kOfferFailed), xfer, bad.message());
      }
      if (!seen.insert({c.hash.lo, c.hash.hi}).second) {  // a duplicate within the manifest
        ++i;
        continue;
      }
      if (!store_->HoldChunk(in.owner, c.hash)) {
        want.push_back(&c);
        lengths.push_back(c.length);
        index.push_back(i);
      }
      ++i;
    }
  }
  std::vector<uint64_t> offsets;
  s = store_->Reserve(in.owner, lengths, &offsets);
  if (!s.ok()) {
    FTRUN_LOG_ERROR("cannot keep a copy of rank {} version {} for agent {}: {}", rank, version, from, s.message());
    store_->ReleaseReservations(in.owner);
    in_.erase({from, xfer});
    return Reply(from, T(ClusterMsg::kOfferFailed), xfer, s.message());
  }
  ByteWriter w;
  w.Put<uint64_t>(xfer);
  w.Put<uint32_t>(static_cast<uint32_t>(want.size()));
  for (size_t k = 0; k < want.size(); ++k) {
    want[k]->offset = offsets[k];
    uint64_t tag = next_tag_++;
    in.tokens.push_back(tag);
    recv_tokens_[tag] = {{from, xfer}, want[k]};
    in.outstanding++;
    t_->PostRecv(from, tag, base_ + offsets[k], want[k]->length, tag);
    w.Put<uint64_t>(index[k]);
    w.Put<uint64_t>(tag);
  }
  t_->Send(from, T(ClusterMsg::kWant), w.data());
  if (in.outstanding == 0) FinishIn({from, xfer});
}

void Replicator::FinishIn(std::pair<PeerId, uint64_t> key) {
  auto it = in_.find(key);
  if (it == in_.end()) return;
  const uint64_t xfer = key.second;
  In& in = it->second;
  Status s = in.error;  // every received chunk was verified in BulkDone
  const int rank = in.manifest.rank;
  const uint64_t version = in.manifest.version;
  const PeerId from = in.from;
  if (s.ok() && store_->Find(rank, version) == nullptr) s = store_->AddManifest(in.owner, std::move(in.manifest));
  store_->ReleaseReservations(in.owner);
  in_.erase(it);
  if (!s.ok()) {
    FTRUN_LOG_WARN("copy of rank {} version {} from agent {} not kept: {}", rank, version, from, s.message());
    Reply(from, T(ClusterMsg::kOfferFailed), xfer, s.message());
  } else {
    Reply(from, T(ClusterMsg::kStored), xfer);
    if (on_stored) on_stored(rank, version);
  }
  PullDone(xfer, from, s);
}

void Replicator::PullDone(uint64_t xfer, PeerId from, const Status& s) {
  auto p = pulls_.find(xfer);
  if (p == pulls_.end()) return;
  PendingPull pull = p->second;
  pulls_.erase(p);
  if (on_pulled) on_pulled(xfer, from, pull.rank, pull.version, s);
}

// The source gave up a copy into our store: its receives end, then FinishIn
// reports it (a puller tries its next holder).
void Replicator::Aborted(PeerId from, ByteReader* r) {
  uint64_t xfer = r->Get<uint64_t>();
  std::string message = r->GetString();
  auto in = in_.find({from, xfer});
  if (!r->ok() || in == in_.end() || !in->second.error.ok()) return;
  in->second.error = Status::Unavailable("agent " + std::to_string(from) + " gave up the copy: " + message);
  for (uint64_t token : in->second.tokens) t_->CancelRecv(token);
}

uint64_t Replicator::Pull(PeerId from, int rank, uint64_t version) {
  uint64_t xfer = kPullBit | next_xfer_++;
  pulls_[xfer] = {rank, version, from, epoch_};
  ByteWriter w;
  w.Put<uint64_t>(xfer);
  w.Put<uint64_t>(epoch_);
  w.Put<int32_t>(rank);
  w.Put<uint64_t>(version);
  t_->Send(from, T(ClusterMsg::kPullRequest), w.data());
  return xfer;
}

void Replicator::PullRequest(PeerId from, ByteReader* r) {
  uint64_t xfer = r->Get<uint64_t>();
  uint64_t epoch = r->Get<uint64_t>();
  int32_t rank = r->Get<int32_t>();
  uint64_t version = r->Get<uint64_t>();
  if (!r->ok() || !(xfer & kPullBit)) return;
  DeferredPull pull{from, xfer, epoch, rank, version, clock_.Now()};
  Status s = roles_.MayPull(from, rank);
  if (s.ok()) return ServePull(pull);
  // The membership that names the puller may still be on its way (it left
  // the coordinator before the puller's kPull did, on another connection).
  if (!roles_.known() || epoch > roles_.epoch()) {
    if (deferred_.size() < kMaxDeferredPulls) {
      deferred_.push_back(pull);
      return;
    }
    s = Status::ResourceExhausted(std::to_string(kMaxDeferredPulls) + " pull requests already wait for a membership");
  }
  RefusePull(pull, s);
}

void Replicator::ServePull(const DeferredPull& p) {
  // Served ahead of routine replication to that peer, in the puller's epoch:
  // the halt of that epoch may reach this agent after the request does.
  queue_[p.from].push_front(Job{p.rank, p.version, std::max(p.epoch, epoch_), p.xfer});
  StartNext(p.from);
}

void Replicator::RefusePull(const DeferredPull& p, const Status& why) {
  FTRUN_LOG_WARN("refused a pull of rank {} version {} by agent {}: {}", p.rank, p.version, p.from, why.message());
  Reply(p.from, T(ClusterMsg::kOfferFailed), p.xfer, "pull refused: " + why.message());
}

void Replicator::SetRoles(PeerRoles roles) {
  roles_ = std::move(roles);
  std::deque<DeferredPull> waiting;
  waiting.swap(deferred_);
  for (const DeferredPull& p : waiting) {
    Status s = roles_.MayPull(p.from, p.rank);
    if (s.ok())
      ServePull(p);
    else if (p.epoch > roles_.epoch())
      deferred_.push_back(p);  // a newer membership may still name it
    else
      RefusePull(p, s);
  }
}

// Pull requests that waited a copy timeout for a membership naming their
// puller are refused (the puller tries its next holder).
void Replicator::ExpireDeferredPulls(std::chrono::steady_clock::time_point now) {
  while (!deferred_.empty() && now - deferred_.front().since > copy_timeout_) {
    DeferredPull p = deferred_.front();
    deferred_.pop_front();
    RefusePull(p, Status::Timeout("no membership naming it came within " + std::to_string(copy_timeout_.count()) +
                                  " ms (cluster.copy_timeout): " + roles_.MayPull(p.from, p.rank).message()));
  }
}

}  // namespace ftrun
