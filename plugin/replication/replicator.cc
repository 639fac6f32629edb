#include "plugin/replication/replicator.h"

#include <algorithm>

#include "plugin/common/bytes.h"
#include "plugin/common/hash.h"
#include "plugin/common/log.h"
#include "plugin/protocol/cluster_messages.h"
#include "plugin/replication/replicator_wire.h"

namespace ftrun {

using namespace replicator_wire;

Replicator::Replicator(Transport* transport, SnapshotStore* store, char* arena_base, uint64_t chunk_size,
                       const Clock& clock)
    : t_(transport), clock_(clock), store_(store), base_(arena_base), chunk_size_(chunk_size) {}

void Replicator::SetEpoch(uint64_t epoch) {
  if (epoch <= epoch_) return;
  epoch_ = epoch;
  for (auto& [peer, q] : queue_) {
    q.erase(std::remove_if(q.begin(), q.end(), [&](const Job& j) { return j.epoch < epoch; }), q.end());
  }
  std::vector<PeerId> stale;
  for (auto& [peer, out] : out_) {
    if (out.job.epoch < epoch) stale.push_back(peer);
  }
  for (PeerId p : stale) FinishOut(p, Status::Unavailable("epoch moved on"));
  for (auto& [key, in] : in_) {
    if (in.epoch >= epoch) continue;
    in.error = Status::Unavailable("epoch moved on");
    for (uint64_t token : in.tokens) t_->CancelRecv(token);
  }
}

void Replicator::SetHolders(std::vector<PeerId> holders) { holders_ = std::move(holders); }

void Replicator::Saved(int rank, uint64_t version) {
  for (PeerId h : holders_) Enqueue(h, Job{rank, version, epoch_, 0});
}

void Replicator::Enqueue(PeerId to, Job job) {
  auto& q = queue_[to];
  if (job.xfer == 0) {  // coalesce: an older queued version of the rank never needs to go
    q.erase(std::remove_if(q.begin(), q.end(),
                           [&](const Job& j) { return j.xfer == 0 && j.rank == job.rank && j.version < job.version; }),
            q.end());
  }
  q.push_back(job);
  StartNext(to);
}

void Replicator::StartNext(PeerId to) {
  if (out_.count(to)) return;
  auto& q = queue_[to];
  while (!q.empty()) {
    Job job = q.front();
    q.pop_front();
    const Manifest* m = store_->Find(job.rank, job.version);
    if (m == nullptr) {  // released (a newer commit) or discarded meanwhile
      if (job.xfer & kPullBit)
        Reply(to, T(ClusterMsg::kOfferFailed), job.xfer,
              "this agent does not hold rank " + std::to_string(job.rank) + " version " + std::to_string(job.version));
      continue;
    }
    if (job.xfer == 0) job.xfer = next_xfer_++;
    Out& out = out_[to];
    out.job = job;
    out.to = to;
    for (const auto& t : m->tensors) {
      for (const auto& c : t.chunks) out.chunks.push_back(c);
    }
    store_->Pin(job.version);
    out.state_bytes = m->state_bytes();
    out.started = out.progress = clock_.Now();
    ByteWriter w;
    w.Put<uint64_t>(job.xfer);
    w.Put<uint64_t>(job.epoch);
    EncodeManifest(*m, &w);
    t_->Send(to, T(ClusterMsg::kOffer), w.data());
    return;
  }
}

void Replicator::Pump(Out& out) {
  auto next_length = [&] { return out.chunks[out.todo.front().first].length; };
  while (!out.todo.empty() && (out.inflight == 0 || out.inflight_bytes + next_length() <= kWindowBytes)) {
    auto [index, tag] = out.todo.front();
    out.todo.pop_front();
    const ChunkRef& c = out.chunks[index];
    const uint64_t offset = c.offset, length = c.length;
    // A pull (a recovery) checks each chunk before it goes, so that a
    // corrupted source is named at once. A routine copy does not: its holder
    // checks every chunk before it says "stored" (BulkDone), and only when
    // it refuses the copy are the chunks sent checked here (SentCorrupt).
    // One hash pass less per copy (9 ms of a core per 256 MiB) on the save
    // path, where the transport's copies already keep the cores busy.
    if (out.job.xfer & kPullBit) {
      if (HashBytes(base_ + offset, length) != c.hash) return SourceCorrupt(out, c, "not sent");
    } else {
      out.sent.push_back(index);
    }
    uint64_t token = kSendTokenBit | next_xfer_++;
    send_tokens_[token] = {out.to, length};
    out.inflight++;
    out.inflight_bytes += length;
    t_->SendBulk(out.to, tag, base_ + offset, length, token);
  }
}

void Replicator::SourceCorrupt(Out& out, ChunkRef chunk, const char* what) {
  const PeerId to = out.to;
  const Job job = out.job;
  Status s = Status::Corruption("chunk " + chunk.hash.ToHex() + " of rank " + std::to_string(job.rank) + " version " +
                                std::to_string(job.version) +
                                " is corrupted in the shared memory of the sending agent; " + what);
  ByteWriter w;
  w.Put<uint64_t>(job.xfer);
  w.PutString(s.message());
  t_->Send(to, T(ClusterMsg::kAbort), w.data());
  if (on_corrupt) on_corrupt(job.rank, job.version, chunk);
  FinishOut(to, s);
}

bool Replicator::SentCorrupt(Out& out) {
  for (size_t index : out.sent) {
    const ChunkRef& c = out.chunks[index];
    if (HashBytes(base_ + c.offset, c.length) != c.hash) {
      SourceCorrupt(out, c, "the holder refused the copy");
      return true;
    }
  }
  return false;
}

void Replicator::FinishOut(PeerId to, const Status& s) {
  auto it = out_.find(to);
  if (it == out_.end()) return;
  const Out& out = it->second;
  if (!s.ok()) {
    FTRUN_LOG_WARN("copy of rank {} version {} to agent {} failed: {}", out.job.rank, out.job.version, to, s.message());
    if (out.job.epoch == epoch_ && !(out.job.xfer & kPullBit) && on_copy_failed) {
      on_copy_failed(out.job.rank, out.job.version, s);
    }
  } else {
    history_.push_back({to, out.job.rank, out.job.version, out.state_bytes, out.bytes_sent,
                        std::chrono::duration<double>(clock_.Now() - out.started).count()});
    if (history_.size() > 32) history_.pop_front();
  }
  store_->Unpin(it->second.job.version);
  // Sends still in flight complete on their own; their tokens are forgotten.
  for (auto t = send_tokens_.begin(); t != send_tokens_.end();)
    t = t->second.first == to ? send_tokens_.erase(t) : std::next(t);
  out_.erase(it);
  StartNext(to);
}

bool Replicator::Handle(PeerId from, uint16_t type, const std::string& payload) {
  ByteReader r(payload);
  switch (static_cast<ClusterMsg>(type)) {
    case ClusterMsg::kOffer:
      Offer(from, &r);
      return true;
    case ClusterMsg::kWant:
      Want(from, &r);
      return true;
    case ClusterMsg::kStored:
      Stored(from, &r);
      return true;
    case ClusterMsg::kOfferFailed:
      OfferFailed(from, &r);
      return true;
    case ClusterMsg::kPullRequest:
      PullRequest(from, &r);
      return true;
    case ClusterMsg::kAbort:
      Aborted(from, &r);
      return true;
    default:
      return false;
  }
}

void Replicator::Reply(PeerId to, uint16_t type, uint64_t xfer, const std::string& message) {
  ByteWriter w;
  w.Put<uint64_t>(xfer);
  if (type == T(ClusterMsg::kOfferFailed)) w.PutString(message);
  t_->Send(to, type, w.data());
}

void Replicator::Want(PeerId from, ByteReader* r) {
  uint64_t xfer = r->Get<uint64_t>();
  auto it = out_.find(from);
  if (it == out_.end() || it->second.job.xfer != xfer) return;  // a transfer we gave up
  Out& out = it->second;
  out.progress = clock_.Now();
  uint32_t n = r->GetCount(16);
  for (uint32_t k = 0; k < n; ++k) {
    uint64_t index = r->Get<uint64_t>();
    uint64_t tag = r->Get<uint64_t>();
    if (!r->ok() || index >= out.chunks.size()) return FinishOut(from, Status::Corruption("bad want list"));
    out.todo.push_back({static_cast<size_t>(index), tag});
  }
  Pump(out);
}

bool Replicator::BulkDone(uint64_t token, const Status& status) {
  if (token & kSendTokenBit) {
    auto it = send_tokens_.find(token);
    if (it == send_tokens_.end()) return true;
    auto [to, length] = it->second;
    send_tokens_.erase(it);
    auto o = out_.find(to);
    if (o == out_.end()) return true;
    if (!status.ok()) {
      FinishOut(to, status);
      return true;
    }
    o->second.inflight--;
    o->second.inflight_bytes -= length;
    o->second.bytes_sent += length;
    o->second.progress = clock_.Now();
    Pump(o->second);
    return true;
  }
  auto it = recv_tokens_.find(token);
  if (it == recv_tokens_.end()) return false;
  auto [key, c] = it->second;
  recv_tokens_.erase(it);
  auto in = in_.find(key);
  if (in == in_.end()) return true;
  In& x = in->second;
  x.progress = clock_.Now();
  if (!status.ok() && x.error.ok()) x.error = status;
  // Verified as each chunk lands, while the next ones are on the wire, and
  // before the holder says "stored": a copy counts toward a commit only once
  // every byte of it is known good. (This is the copy's one check: a
  // routine copy's source sends without checking, see Pump.) Checking after
  // the acknowledgement (off the critical path) would let a commit count a
  // copy that turns out bad, and the one node that could send it again may
  // be the next to die, which is when the copy is needed. The cost is one XXH3 pass (~28 GB/s a
  // core here), overlapped with the transfer; it shows only where the
  // transport's copies already use every core (TCP on a 2-core machine).
  if (status.ok() && x.error.ok() && HashBytes(base_ + c->offset, c->length) != c->hash) {
    x.error = Status::Corruption("chunk " + c->hash.ToHex() + " of rank " + std::to_string(x.manifest.rank) +
                                 " version " + std::to_string(x.manifest.version) + " from agent " +
                                 std::to_string(x.from) + " arrived with different bytes (hash mismatch)");
  }
  if (--x.outstanding == 0) FinishIn(key);
  return true;
}

void Replicator::Stored(PeerId from, ByteReader* r) {
  uint64_t xfer = r->Get<uint64_t>();
  auto it = out_.find(from);
  if (it != out_.end() && it->second.job.xfer == xfer) FinishOut(from, Status::Ok());
}

void Replicator::OfferFailed(PeerId from, ByteReader* r) {
  uint64_t xfer = r->Get<uint64_t>();
  std::string message = r->GetString();
  auto it = out_.find(from);
  if (it != out_.end() && it->second.job.xfer == xfer && !SentCorrupt(it->second))
    FinishOut(from, Status::Unavailable("agent " + std::to_string(from) + " refused: " + message));
  auto p = pulls_.find(xfer);
  if (p != pulls_.end() && p->second.from == from && !in_.count({from, xfer})) {
    PullDone(xfer, from, Status::Unavailable(message));
  }
}

void Replicator::Tick(std::chrono::steady_clock::time_point now) {
  ExpireDeferredPulls(now);
  const std::string why = "no progress for " + std::to_string(copy_timeout_.count()) +
                          " ms (cluster.copy_timeout); cancelled on both sides, the connection is reset";
  std::set<PeerId> stalled;
  for (const auto& [peer, out] : out_) {
    if (now - out.progress > copy_timeout_) stalled.insert(peer);
  }
  for (PeerId to : stalled) {
    // The rest of this peer's queue goes too: its jobs would be offered on
    // the connection about to be reset. A routine copy's failure fails its
    // round at the coordinator, which starts a newer one.
    queue_.erase(to);
    Out& out = out_.at(to);
    ByteWriter w;
    w.Put<uint64_t>(out.job.xfer);
    w.PutString(why);
    t_->Send(to, T(ClusterMsg::kAbort), w.data());
    FinishOut(to, Status::Timeout(why));  // the WARN
  }
  for (auto& [key, in] : in_) {
    if (in.stalled || now - in.progress <= copy_timeout_) continue;
    in.stalled = true;
    stalled.insert(key.first);
    FTRUN_LOG_WARN("copy of rank {} version {} from agent {}: {} ({} receive(s) outstanding)", in.manifest.rank,
                   in.manifest.version, key.first, why, in.outstanding);
    if (in.error.ok())
      in.error = Status::Timeout("the copy made no progress for " + std::to_string(copy_timeout_.count()) +
                                 " ms (cluster.copy_timeout)");
    // Each ends in BulkDone (cancelled, or failed by the reset); FinishIn
    // then refuses the copy and lets the reservations go.
    for (uint64_t token : in.tokens) t_->CancelRecv(token);
  }
  for (PeerId p : stalled) {
    if (on_stalled) on_stalled(p);
  }
}

void Replicator::PeerDown(PeerId peer) {
  queue_.erase(peer);
  deferred_.erase(
      std::remove_if(deferred_.begin(), deferred_.end(), [&](const DeferredPull& p) { return p.from == peer; }),
      deferred_.end());
  FinishOut(peer, Status::Unavailable("agent " + std::to_string(peer) + " is down"));
  for (auto& [key, in] : in_) {
    if (key.first == peer && in.error.ok())
      in.error = Status::Unavailable("agent " + std::to_string(peer) + " is down");
  }
  // Receives from it are cancelled by the transport; each ends in BulkDone.
  // A pull it never started an offer for fails now.
  std::vector<std::pair<uint64_t, PendingPull>> failed;
  for (const auto& [xfer, pull] : pulls_) {
    if (pull.from == peer && !in_.count({peer, xfer})) failed.push_back({xfer, pull});
  }
  for (const auto& [xfer, pull] : failed) {
    pulls_.erase(xfer);
    if (on_pulled) {
      on_pulled(xfer, peer, pull.rank, pull.version, Status::Unavailable("agent " + std::to_string(peer) + " is down"));
    }
  }
}

}  // namespace ftrun
