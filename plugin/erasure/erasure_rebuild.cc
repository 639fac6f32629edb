#include "plugin/erasure/erasure_rebuild.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "plugin/common/log.h"
#include "plugin/protocol/id_ranges.h"

namespace ftrun {
namespace {

constexpr size_t kMaxChoices = 16;  // decodes of one slice, at most

// The next choice of k of `avail` (ascending) after those in `tried`, in
// lexicographic order; empty when none is left.
std::vector<int> NextChoice(const std::vector<int>& avail, size_t k, const std::set<std::vector<int>>& tried) {
  if (avail.size() < k) return {};
  std::vector<size_t> idx(k);
  for (size_t i = 0; i < k; ++i) idx[i] = i;
  for (;;) {
    std::vector<int> c;
    for (size_t i : idx) c.push_back(avail[i]);
    if (!tried.count(c)) return c;
    size_t i = k;
    while (i > 0 && idx[i - 1] == avail.size() - k + i - 1) --i;
    if (i == 0) return {};
    ++idx[i - 1];
    for (size_t j = i; j < k; ++j) idx[j] = idx[j - 1] + 1;
  }
}

}  // namespace

ErasureRebuild::ErasureRebuild(Transport* transport, SnapshotStore* store, char* arena_base, const GroupCode* code,
                               std::function<void(PeerId)> connect)
    : t_(transport), target_(store, arena_base, id_ranges::kRebuildOwner), code_(code), connect_(std::move(connect)) {}

void ErasureRebuild::Begin(uint64_t epoch, uint64_t version, std::vector<int> ranks, std::vector<ErasureSource> group,
                           int self) {
  Cancel();
  active_ = true;
  stats_ = {};
  misses_.clear();
  epoch_ = epoch;
  version_ = version;
  ranks_ = std::move(ranks);
  group_ = std::move(group);
  self_ = self;
  manifest_sources_.clear();
  for (int pass = 0; pass < 2; ++pass) {  // members with their data first, then parity only
    for (size_t m = 0; m < group_.size(); ++m) {
      const ErasureSource& g = group_[m];
      if (static_cast<int>(m) != self_ && g.agent != kNoAgent && (pass == 0 ? g.data : (!g.data && g.parity)))
        manifest_sources_.push_back(static_cast<int>(m));
    }
  }
  FTRUN_LOG_INFO("rebuilding ranks of version {} from erasure group members ({} survivors)", version_,
                 manifest_sources_.size());
  AskManifests();
}

void ErasureRebuild::Cancel() {
  for (auto it = asks_.begin(); it != asks_.end();) {
    if (!it->second.posted) {
      it = asks_.erase(it);  // nothing of ours refers to its buffer
      continue;
    }
    if (!it->second.dead) t_->CancelRecv(it->first);
    it->second.dead = true;  // its buffer stays until the receive ends
    ++it;
  }
  active_ = false;
  pieces_.clear();
  pending_.clear();
  in_flight_ = 0;
  pool_.Clear();
  target_.Release();
  manifests_.clear();
  shard_.reset();
}

void ErasureRebuild::AskManifests() {
  if (manifest_sources_.empty()) {
    return Fail(Status::NotFound("no surviving member of the erasure group has this node's manifests of version " +
                                 std::to_string(version_)));
  }
  const int m = manifest_sources_.front();
  manifest_sources_.erase(manifest_sources_.begin());
  const uint64_t xfer = kRebuildIdBit | next_id_++;
  asks_[xfer] = {0, Source(m), nullptr, true, false, false, -1};
  connect_(Source(m));
  FragmentRequestMsg r;
  r.xfer = xfer;
  r.epoch = epoch_;
  r.version = version_;
  r.kind = FragmentRequestMsg::kManifests;
  r.index = self_;
  SendMsg(t_, Source(m), r);
}

bool ErasureRebuild::Handle(PeerId from, uint16_t type, const std::string& payload) {
  switch (static_cast<ClusterMsg>(type)) {
    case ClusterMsg::kFragmentManifests: {
      FragmentManifestsMsg m;
      Status s = ftrun::Decode(payload, &m);
      auto it = asks_.find(m.xfer);
      if (it == asks_.end() || it->second.peer != from || !it->second.manifests) return true;
      const bool dead = it->second.dead;
      asks_.erase(it);
      if (dead || !active_) return true;
      std::vector<int> got;
      for (const Manifest& x : m.manifests) got.push_back(x.version == version_ ? x.rank : -1);
      if (s.ok() && got != ranks_) {
        s = Status::InvalidArgument("agent " + std::to_string(from) + " sent manifests of other ranks or versions");
      }
      if (!s.ok()) {
        FTRUN_LOG_WARN("manifests for the rebuild: {}", s.message());
        AskManifests();
        return true;
      }
      manifests_ = std::move(m.manifests);
      Plan();
      return true;
    }
    case ClusterMsg::kFragmentReady: {
      FragmentReadyMsg m;
      if (!ftrun::Decode(payload, &m).ok()) return true;
      auto it = asks_.find(m.xfer);
      if (it == asks_.end() || it->second.peer != from || it->second.manifests || it->second.posted) return true;
      Ask& ask = it->second;
      ask.posted = true;
      t_->PostRecv(from, m.xfer, ask.buf->data(), ask.buf->size(), m.xfer);
      SendMsg(t_, from, FragmentGoMsg{m.xfer});
      return true;
    }
    case ClusterMsg::kFragmentRefused: {
      FragmentRefusedMsg m;
      if (!ftrun::Decode(payload, &m).ok()) return true;
      auto it = asks_.find(m.xfer);
      if (it == asks_.end() || it->second.peer != from) return true;
      FTRUN_LOG_WARN("agent {} cannot serve the rebuild: {}", from, m.message);
      if (it->second.manifests) {
        const bool dead = it->second.dead;
        asks_.erase(it);
        if (!dead && active_) AskManifests();
        return true;
      }
      if (!it->second.dead) Lost(it->second.piece, from);
      return true;
    }
    default:
      return false;
  }
}

void ErasureRebuild::Plan() {
  std::vector<const Manifest*> mine;
  for (const Manifest& m : manifests_) mine.push_back(&m);
  shard_ = std::make_unique<NodeShard>(mine);
  slice_len_ = shard_->SliceLength(code_->data());
  if (Status s = target_.Reserve(shard_.get()); !s.ok()) return Fail(s);
  pieces_.clear();
  pending_.clear();
  for (int t = 0; t < code_->data(); ++t) {
    const GroupCode::Place p = code_->Locate(self_, static_cast<uint64_t>(t) * slice_len_, slice_len_);
    for (uint64_t off = 0; off < slice_len_ && static_cast<uint64_t>(t) * slice_len_ + off < shard_->size();
         off += piece_) {
      bool wanted = false;  // (a piece of chunks the store holds already is not fetched)
      target_.Extents(static_cast<uint64_t>(t) * slice_len_ + off, std::min(piece_, slice_len_ - off),
                      [&wanted](uint8_t*, uint64_t, uint64_t) { wanted = true; });
      if (!wanted) continue;
      Piece piece;
      piece.slice = t;
      piece.stripe = p.stripe;
      piece.fragment = p.fragment;
      piece.offset = off;
      piece.length = std::min(piece_, slice_len_ - off);
      pending_.push_back(pieces_.size());
      pieces_.push_back(std::move(piece));
    }
  }
  in_flight_ = 0;
  FetchMore();
}

// The next choice of `data` fragments for piece u: each from a survivor
// that has it, none that failed to arrive, none tried before. The first
// choice rotates with u, so that every survivor serves its share.
void ErasureRebuild::Fetch(size_t u) {
  Piece& s = pieces_[u];
  const Stripe& stripe = code_->stripes()[static_cast<size_t>(s.stripe)];
  const size_t d = static_cast<size_t>(code_->data());
  std::vector<int> avail;
  for (int f = 0; f < code_->members(); ++f) {
    const int m = stripe.MemberOf(f);
    const ErasureSource& g = group_[static_cast<size_t>(m)];
    if (m == self_ || g.agent == kNoAgent || !(f < code_->data() ? g.data : g.parity)) continue;
    avail.push_back(f);
  }
  s.chosen.clear();
  if (s.tried.empty() && avail.size() >= d) {
    for (size_t i = 0; i < d; ++i) s.chosen.push_back(avail[(u + i) % avail.size()]);
    std::sort(s.chosen.begin(), s.chosen.end());
  } else if (s.tried.size() < kMaxChoices) {
    s.chosen = NextChoice(avail, d, s.tried);
  }
  if (s.chosen.empty()) {
    return Fail(Status::Unavailable("stripe " + std::to_string(s.stripe) + " of the erasure group has " +
                                    std::to_string(avail.size()) + " usable fragments left (" + std::to_string(d) +
                                    " needed, " + std::to_string(s.tried.size()) +
                                    " choices tried) to rebuild this node's slice " + std::to_string(s.slice)));
  }
  s.tried.insert(s.chosen);
  s.bufs.clear();
  s.outstanding = static_cast<int>(s.chosen.size());
  for (int f : s.chosen) {  // in parallel, from `data` survivors
    const PeerId peer = Source(stripe.MemberOf(f));
    const uint64_t xfer = kRebuildIdBit | next_id_++;
    auto buf = std::make_shared<std::vector<uint8_t>>(pool_.Take(s.length));
    s.bufs.push_back(buf);
    asks_[xfer] = {u, peer, buf, false, false, false, f};
    connect_(peer);
    FragmentRequestMsg r;
    r.xfer = xfer;
    r.epoch = epoch_;
    r.version = version_;
    r.kind = f < code_->data() ? FragmentRequestMsg::kData : FragmentRequestMsg::kParity;
    r.index = f < code_->data() ? stripe.data[static_cast<size_t>(f)].slice : f - code_->data();
    r.offset = s.offset;
    r.length = s.length;
    r.tag = xfer;
    SendMsg(t_, peer, r);
  }
}

void ErasureRebuild::FetchMore() {
  while (active_ && in_flight_ < kPiecesInFlight && !pending_.empty()) {
    const size_t u = pending_.front();
    pending_.erase(pending_.begin());
    in_flight_++;
    Fetch(u);
  }
}

void ErasureRebuild::AbandonAsks(size_t u) {
  for (auto it = asks_.begin(); it != asks_.end();) {
    Ask& ask = it->second;
    if (ask.manifests || ask.dead || ask.piece != u) {
      ++it;
    } else if (!ask.posted) {
      it = asks_.erase(it);
    } else {
      ask.dead = true;  // its buffer stays with it until the receive ends
      t_->CancelRecv(it->first);
      ++it;
    }
  }
}

void ErasureRebuild::LeaveOut(PeerId peer) {
  for (ErasureSource& g : group_) {
    if (g.agent == peer) g.data = g.parity = false;
  }
}

void ErasureRebuild::Lost(size_t u, PeerId peer) {
  AbandonAsks(u);
  if (++misses_[peer] == kMisses) {
    FTRUN_LOG_WARN("agent {} failed the rebuild {} times: its fragments are decoded around from now on", peer, kMisses);
    LeaveOut(peer);
  }
  pieces_[u].tried.erase(pieces_[u].chosen);  // (the choice was not decoded)
  Fetch(u);
}

bool ErasureRebuild::BulkDone(uint64_t token, const Status& status) {
  auto it = asks_.find(token);
  if (it == asks_.end()) return false;
  const Ask ask = it->second;
  asks_.erase(it);
  if (ask.dead || !active_) return true;
  if (!status.ok()) {
    FTRUN_LOG_WARN("a fragment from agent {} for the rebuild did not arrive: {}", ask.peer, status.message());
    Lost(ask.piece, ask.peer);
    return true;
  }
  stats_.fragment_bytes += ask.buf->size();
  if (--pieces_[ask.piece].outstanding == 0) Decode(ask.piece);
  return true;
}

void ErasureRebuild::Tick(std::chrono::steady_clock::time_point now) {
  if (!active_) return;
  bool manifests = false;
  std::vector<std::pair<size_t, PeerId>> late;  // (piece, survivor)
  for (auto& [xfer, ask] : asks_) {
    if (ask.dead) continue;
    if (!ask.seen) {
      ask.seen = now;
      continue;
    }
    if (now - *ask.seen < kAskTimeout) continue;
    FTRUN_LOG_WARN("agent {} has not served the rebuild's {} within {} s: asking again or elsewhere", ask.peer,
                   ask.manifests ? "manifests" : "fragment " + std::to_string(ask.fragment),
                   std::chrono::duration_cast<std::chrono::seconds>(kAskTimeout).count());
    if (ask.manifests) {
      manifests = true;
      ask.dead = true;  // (its answer, if one comes, is ignored)
    } else {
      late.emplace_back(ask.piece, ask.peer);
    }
  }
  if (manifests) AskManifests();
  std::set<size_t> done;
  for (const auto& [u, peer] : late) {
    if (!active_) return;
    if (done.insert(u).second) Lost(u, peer);  // (abandons the piece's other asks too)
  }
}

void ErasureRebuild::PeerDown(PeerId peer) {
  std::set<size_t> hit;
  bool manifests = false;
  for (auto& [xfer, ask] : asks_) {
    if (ask.peer != peer || ask.dead) continue;
    if (ask.manifests) {
      manifests = true;
      ask.dead = true;  // (its answer, if one comes, is ignored)
    } else {
      hit.insert(ask.piece);
    }
  }
  LeaveOut(peer);  // gone for this rebuild
  if (!active_) return;
  if (manifests) AskManifests();
  for (size_t u : hit) {
    if (!active_) return;
    AbandonAsks(u);
    pieces_[u].tried.erase(pieces_[u].chosen);
    Fetch(u);
  }
}

// Piece u decoded straight into the extents its bytes belong in.
void ErasureRebuild::Decode(size_t u) {
  Piece& s = pieces_[u];
  Status st;
  target_.Extents(static_cast<uint64_t>(s.slice) * slice_len_ + s.offset, s.length,
                  [&](uint8_t* dest, uint64_t from, uint64_t n) {
                    std::vector<const uint8_t*> in;
                    for (const Buffer& b : s.bufs) in.push_back(b->data() + from);
                    if (st.ok()) st = code_->DecodeFragment(n, s.chosen, in.data(), s.fragment, dest);
                  });
  if (!st.ok()) return Fail(st);
  for (Buffer& b : s.bufs) pool_.Give(std::move(*b));
  s.bufs.clear();
  in_flight_--;
  if (!pending_.empty() || in_flight_ > 0) return FetchMore();
  Verify();
}

// Every chunk written against its hash; the pieces under a chunk that fails
// are decoded again from another choice of fragments.
void ErasureRebuild::Verify() {
  std::string first;
  std::set<size_t> bad;
  for (const auto& [begin, end] : target_.Check(&first)) {
    for (size_t u = 0; u < pieces_.size(); ++u) {
      const uint64_t at = static_cast<uint64_t>(pieces_[u].slice) * slice_len_ + pieces_[u].offset;
      if (at < end && begin < at + pieces_[u].length) bad.insert(u);
    }
  }
  pool_.Clear();
  if (bad.empty()) return Store();
  FTRUN_LOG_WARN("rebuilt chunk {} fails its hash: decoding {} piece(s) again from other fragments", first, bad.size());
  stats_.redecoded += static_cast<int>(bad.size());
  pending_.assign(bad.begin(), bad.end());
  FetchMore();
}

void ErasureRebuild::Store() {
  if (Status s = target_.Commit(&manifests_); !s.ok()) return Fail(s);
  FTRUN_LOG_INFO(
      "rebuilt {} ranks of version {} ({} bytes) from the erasure group, every chunk checked ({} bytes of "
      "fragments fetched, {} pieces decoded again)",
      ranks_.size(), version_, shard_->size(), stats_.fragment_bytes, stats_.redecoded);
  active_ = false;
  if (on_done) on_done(epoch_, version_, ranks_);
}

void ErasureRebuild::Fail(const Status& why) {
  const int rank = ranks_.empty() ? -1 : ranks_.front();
  Cancel();
  FTRUN_LOG_ERROR("the rebuild of version {} from the erasure group failed: {}", version_, why.message());
  if (on_failed) on_failed(epoch_, version_, rank, why);
}

}  // namespace ftrun
