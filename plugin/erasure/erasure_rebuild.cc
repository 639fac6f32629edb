#include "plugin/erasure/erasure_rebuild.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "plugin/common/hash.h"
#include "plugin/common/log.h"

namespace ftrun {
namespace {

constexpr uint64_t kOwner = (1ull << 61) + 1;  // the store reservation of a rebuild
constexpr size_t kMaxChoices = 16;             // decodes of one slice, at most

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
    : t_(transport), store_(store), base_(arena_base), code_(code), connect_(std::move(connect)) {}

void ErasureRebuild::Begin(uint64_t epoch, uint64_t version, std::vector<int> ranks, std::vector<ErasureSource> group,
                           int self) {
  Cancel();
  active_ = true;
  stats_ = {};
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
  slices_.clear();
  bytes_.clear();
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
  asks_[xfer] = {0, Source(m), nullptr, true, false, false};
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
      if (!it->second.dead) Lost(it->second.slice, it->second.fragment);
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
  bytes_.assign(static_cast<size_t>(code_->data()) * slice_len_, 0);
  slices_.assign(static_cast<size_t>(code_->data()), {});
  pending_.clear();
  for (int t = 0; t < code_->data(); ++t) {
    const GroupCode::Place p = code_->Locate(self_, static_cast<uint64_t>(t) * slice_len_, slice_len_);
    slices_[static_cast<size_t>(t)].stripe = p.stripe;
    slices_[static_cast<size_t>(t)].fragment = p.fragment;
    pending_.push_back(static_cast<size_t>(t));
  }
  in_flight_ = 0;
  FetchMore();
}

// The next choice of `data` fragments for slice t: each from a survivor
// that has it, none that failed to arrive, none tried before.
void ErasureRebuild::Fetch(size_t t) {
  Slice& s = slices_[t];
  const Stripe& stripe = code_->stripes()[static_cast<size_t>(s.stripe)];
  std::vector<int> avail;
  for (int f = 0; f < code_->members(); ++f) {
    const int m = stripe.MemberOf(f);
    const ErasureSource& g = group_[static_cast<size_t>(m)];
    if (m == self_ || g.agent == kNoAgent || s.excluded.count(f) || !(f < code_->data() ? g.data : g.parity)) continue;
    avail.push_back(f);
  }
  s.chosen = s.tried.size() < kMaxChoices ? NextChoice(avail, static_cast<size_t>(code_->data()), s.tried)
                                          : std::vector<int>{};
  if (s.chosen.empty()) {
    return Fail(Status::Unavailable("stripe " + std::to_string(s.stripe) + " of the erasure group has " +
                                    std::to_string(avail.size()) + " usable fragments left (" +
                                    std::to_string(code_->data()) + " needed, " + std::to_string(s.tried.size()) +
                                    " choices tried) to rebuild this node's slice " + std::to_string(t)));
  }
  s.tried.insert(s.chosen);
  s.bufs.clear();
  s.outstanding = static_cast<int>(s.chosen.size());
  for (int f : s.chosen) {  // in parallel, from `data` survivors
    const PeerId peer = Source(stripe.MemberOf(f));
    const uint64_t xfer = kRebuildIdBit | next_id_++;
    auto buf = std::make_shared<std::vector<uint8_t>>(slice_len_);
    s.bufs.push_back(buf);
    asks_[xfer] = {t, peer, buf, false, false, false, f};
    connect_(peer);
    FragmentRequestMsg r;
    r.xfer = xfer;
    r.epoch = epoch_;
    r.version = version_;
    r.kind = f < code_->data() ? FragmentRequestMsg::kData : FragmentRequestMsg::kParity;
    r.index = f < code_->data() ? stripe.data[static_cast<size_t>(f)].slice : f - code_->data();
    r.length = slice_len_;
    r.tag = xfer;
    SendMsg(t_, peer, r);
  }
}

void ErasureRebuild::FetchMore() {
  while (active_ && in_flight_ < kSlicesInFlight && !pending_.empty()) {
    const size_t t = pending_.front();
    pending_.erase(pending_.begin());
    in_flight_++;
    Fetch(t);
  }
}

void ErasureRebuild::AbandonAsks(size_t t) {
  for (auto it = asks_.begin(); it != asks_.end();) {
    Ask& ask = it->second;
    if (ask.manifests || ask.dead || ask.slice != t) {
      ++it;
    } else if (!ask.posted) {
      it = asks_.erase(it);
    } else {
      ask.dead = true;
      t_->CancelRecv(it->first);
      ++it;
    }
  }
}

void ErasureRebuild::Lost(size_t t, int fragment) {
  AbandonAsks(t);
  slices_[t].excluded.insert(fragment);
  slices_[t].tried.erase(slices_[t].chosen);  // (the choice was not decoded)
  Fetch(t);
}

bool ErasureRebuild::BulkDone(uint64_t token, const Status& status) {
  auto it = asks_.find(token);
  if (it == asks_.end()) return false;
  const Ask ask = it->second;
  asks_.erase(it);
  if (ask.dead || !active_) return true;
  if (!status.ok()) {
    FTRUN_LOG_WARN("a fragment from agent {} for the rebuild did not arrive: {}", ask.peer, status.message());
    Lost(ask.slice, ask.fragment);
    return true;
  }
  stats_.fragment_bytes += ask.buf->size();
  if (--slices_[ask.slice].outstanding == 0) Decode(ask.slice);
  return true;
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
      hit.insert(ask.slice);
    }
  }
  for (ErasureSource& g : group_) {
    if (g.agent == peer) g.data = g.parity = false;  // gone for this rebuild
  }
  if (!active_) return;
  if (manifests) AskManifests();
  for (size_t t : hit) {
    if (!active_) return;
    AbandonAsks(t);
    slices_[t].tried.erase(slices_[t].chosen);
    Fetch(t);
  }
}

void ErasureRebuild::Decode(size_t t) {
  Slice& s = slices_[t];
  std::vector<const uint8_t*> in;
  for (const auto& b : s.bufs) in.push_back(b->data());
  Status st = code_->DecodeFragment(slice_len_, s.chosen, in.data(), s.fragment, bytes_.data() + t * slice_len_);
  if (!st.ok()) return Fail(st);
  s.bufs.clear();
  in_flight_--;
  if (!pending_.empty() || in_flight_ > 0) return FetchMore();
  Verify();
}

// Every chunk against its hash; the slices under a chunk that fails are
// decoded again from another choice of fragments.
void ErasureRebuild::Verify() {
  std::set<size_t> bad;
  std::string first;
  for (const NodeShard::Chunk& c : shard_->chunks()) {
    if (HashBytes(bytes_.data() + c.at, c.ref->length) == c.ref->hash) continue;
    if (first.empty()) first = c.ref->hash.ToHex();
    for (uint64_t t = c.at / slice_len_; t * slice_len_ < c.at + c.ref->length; ++t) bad.insert(t);
  }
  if (bad.empty()) return Store();
  FTRUN_LOG_WARN("rebuilt chunk {} fails its hash: decoding {} slice(s) again from other fragments", first, bad.size());
  stats_.redecoded += static_cast<int>(bad.size());
  pending_.assign(bad.begin(), bad.end());
  FetchMore();
}

void ErasureRebuild::Store() {
  std::vector<uint64_t> lengths;
  std::set<ChunkHash, bool (*)(const ChunkHash&, const ChunkHash&)> fresh(
      [](const ChunkHash& a, const ChunkHash& b) { return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo; });
  std::vector<const NodeShard::Chunk*> written;
  std::set<const Manifest*> kept;  // ranks this node still holds at the version
  for (const Manifest& m : manifests_) {
    if (store_->Find(m.rank, m.version)) kept.insert(&m);
  }
  for (const NodeShard::Chunk& c : shard_->chunks()) {
    if (store_->ChunkOffset(c.ref->hash) || !fresh.insert(c.ref->hash).second) continue;  // by hash
    lengths.push_back(c.ref->length);
    written.push_back(&c);
  }
  std::vector<uint64_t> offsets;
  if (Status s = store_->Reserve(kOwner, lengths, &offsets); !s.ok()) return Fail(s);
  std::map<const ChunkRef*, uint64_t> where;
  for (size_t i = 0; i < written.size(); ++i) {
    std::memcpy(base_ + offsets[i], bytes_.data() + written[i]->at, written[i]->ref->length);
    where[written[i]->ref] = offsets[i];
  }
  for (Manifest& m : manifests_) {
    for (TensorManifest& t : m.tensors) {
      for (ChunkRef& c : t.chunks) {
        auto w = where.find(&c);
        c.offset = w == where.end() ? kNoOffset : w->second;
      }
    }
  }
  Status s;
  for (const Manifest& m : manifests_) {
    if (s.ok() && !kept.count(&m)) s = store_->AddManifest(kOwner, m);
  }
  store_->ReleaseReservations(kOwner);
  if (!s.ok()) return Fail(s);
  FTRUN_LOG_INFO(
      "rebuilt {} ranks of version {} ({} bytes) from the erasure group, every chunk checked ({} bytes of "
      "fragments fetched, {} slices decoded again)",
      ranks_.size(), version_, shard_->size(), stats_.fragment_bytes, stats_.redecoded);
  active_ = false;
  bytes_.clear();
  if (on_done) on_done(epoch_, version_, ranks_);
}

void ErasureRebuild::Fail(const Status& why) {
  const int rank = ranks_.empty() ? -1 : ranks_.front();
  Cancel();
  FTRUN_LOG_ERROR("the rebuild of version {} from the erasure group failed: {}", version_, why.message());
  if (on_failed) on_failed(epoch_, version_, rank, why);
}

}  // namespace ftrun
