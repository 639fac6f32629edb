#include "launcher/agent/store_service.h"

#include <algorithm>

#include "plugin/common/bytes.h"
#include "plugin/common/log.h"
#include "plugin/ipc/rank_messages.h"

namespace ftrun {
namespace {

void SendCommitted(Connection& conn, uint64_t version) {
  (void)conn.Send(MsgType::kCommitted, Encode(VersionMsg{version}));
}

}  // namespace

StoreService::StoreService(SnapshotStore* store, const CommitTracker* tracker, VersionRetention* retention,
                           uint64_t chunk_size, const Clock& clock)
    : store_(store), tracker_(tracker), retention_(retention), chunk_size_(chunk_size), clock_(clock) {}

bool StoreService::Waiting(const Connection& conn) const {
  for (const Waiter& w : waiters_) {
    if (w.conn == &conn) return true;
  }
  return false;
}

bool StoreService::Handle(Connection& conn, MsgType type, const std::string& payload) {
  switch (type) {
    case MsgType::kAlloc:
      HandleAlloc(conn, payload);
      return true;
    case MsgType::kSave:
      HandleSave(conn, payload);
      return true;
    case MsgType::kLoad:
      HandleLoad(conn, payload);
      return true;
    case MsgType::kLoadDone:
      HandleLoadDone(conn, payload);
      return true;
    case MsgType::kList:
      HandleList(conn);
      return true;
    case MsgType::kWaitCommitted:
      HandleWaitCommitted(conn, payload);
      return true;
    default:
      return false;
  }
}

void StoreService::HandleAlloc(Connection& conn, const std::string& payload) {
  AllocMsg ask;
  if (Status bad = Decode(payload, &ask); !bad.ok()) {
    (void)conn.SendError(bad);
    return;
  }
  const uint64_t version = ask.version;
  const std::vector<uint64_t>& lengths = ask.lengths;
  for (uint64_t len : lengths) {
    if (len == 0 || len > chunk_size_) {
      (void)conn.SendError(Status::InvalidArgument("reserve request for a " + std::to_string(len) +
                                                   "-byte chunk; chunks are 1.." + std::to_string(chunk_size_) +
                                                   " bytes"));
      return;
    }
  }
  // The first reservation of a save attempt: whatever an abandoned attempt
  // (failed before its manifest was sent) still holds goes now.
  if (ask.first) store_->ReleaseReservations(conn.id);
  std::vector<uint64_t> offsets;
  Status s = store_->Reserve(conn.id, lengths, &offsets);
  if (!s.ok()) {
    FTRUN_LOG_WARN("rank {} save of version {} refused: {}", conn.rank, version, s.message());
    (void)conn.SendError(s.Annotate("rank " + std::to_string(conn.rank) + " version " + std::to_string(version)));
    return;
  }
  (void)conn.Send(MsgType::kAllocOk, Encode(AllocOkMsg{std::move(offsets)}));
}

void StoreService::HandleSave(Connection& conn, const std::string& payload) {
  ByteReader r(payload);
  Manifest m;
  Status s = DecodeManifest(&r, "rank " + std::to_string(conn.rank) + " save", &m);
  if (s.ok() && !r.done()) s = Status::Corruption("rank " + std::to_string(conn.rank) + " save: trailing bytes");
  if (s.ok() && m.rank != conn.rank) {
    s = Status::InvalidArgument("a manifest for rank " + std::to_string(m.rank) + " came from rank " +
                                std::to_string(conn.rank));
  }
  for (const auto& t : m.tensors) {
    for (size_t i = 0; s.ok() && i < t.chunks.size(); ++i) {
      s = CheckChunkLength("rank " + std::to_string(conn.rank) + " save", t, i, chunk_size_);
    }
  }
  const uint64_t version = m.version;
  if (s.ok()) s = store_->AddManifest(conn.id, std::move(m));
  store_->ReleaseReservations(conn.id);
  if (!s.ok()) {
    if (s.code() != Code::kChunkMissing) FTRUN_LOG_ERROR("rank {} save refused: {}", conn.rank, s.message());
    (void)conn.SendError(s);
    return;
  }
  if (on_saved) on_saved(conn.rank, version);  // reported to the coordinator, which commits
  (void)conn.Send(MsgType::kSaveOk, Encode(SaveOkMsg{version, tracker_->last_committed()}));
}

void StoreService::Committed(uint64_t version) {
  FTRUN_LOG_DEBUG("version {} committed", version);
  retention_->Committed(version);
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->version <= version) {
      SendCommitted(*it->conn, version);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  if (on_committed) on_committed(version);
}

void StoreService::HandleLoad(Connection& conn, const std::string& payload) {
  VersionMsg ask;
  if (Status bad = Decode(payload, &ask, "load request"); !bad.ok()) {
    (void)conn.SendError(bad);
    return;
  }
  uint64_t version = ask.version;
  auto committed = tracker_->last_committed();
  if (version == ~0ull) {
    if (!committed) {
      (void)conn.SendError(Status::NotFound("no committed version yet: nothing to restore"));
      return;
    }
    version = *committed;
  }
  if (!committed || version > *committed) {
    (void)conn.SendError(Status::FailedPrecondition(
        "version " + std::to_string(version) + " is not committed (last committed: " +
        (committed ? std::to_string(*committed) : std::string("none")) + "); only committed versions are restored"));
    return;
  }
  const Manifest* m = store_->Find(conn.rank, version);
  if (m == nullptr) {
    (void)conn.SendError(Status::NotFound("rank " + std::to_string(conn.rank) + " has no snapshot at version " +
                                          std::to_string(version) + " in this node's store"));
    return;
  }
  ByteWriter w;
  EncodeManifest(*m, &w);
  store_->Pin(version);
  conn.pins.push_back(version);
  (void)conn.Send(MsgType::kLoadOk, w.data());
}

void StoreService::HandleLoadDone(Connection& conn, const std::string& payload) {
  VersionMsg done;
  if (!Decode(payload, &done, "load-done notice").ok()) return;
  const uint64_t version = done.version;
  auto it = std::find(conn.pins.begin(), conn.pins.end(), version);
  if (it == conn.pins.end()) return;
  conn.pins.erase(it);
  store_->Unpin(version);
}

void StoreService::HandleList(Connection& conn) {
  auto committed = tracker_->last_committed();
  ListOkMsg list;
  for (uint64_t v : store_->RankVersions(conn.rank)) {
    (committed && v <= *committed ? list.committed : list.pending).push_back(v);
  }
  list.has_committed = committed.has_value();
  list.committed_version = committed.value_or(0);
  (void)conn.Send(MsgType::kListOk, Encode(list));
}

void StoreService::HandleWaitCommitted(Connection& conn, const std::string& payload) {
  WaitCommittedMsg ask;
  if (Status bad = Decode(payload, &ask); !bad.ok()) {
    (void)conn.SendError(bad);
    return;
  }
  const uint64_t version = ask.version;
  const int32_t timeout_ms = ask.timeout_ms;
  auto committed = tracker_->last_committed();
  if (committed && *committed >= version) {
    SendCommitted(conn, *committed);
    return;
  }
  auto deadline = timeout_ms < 0 ? Clock::Time::max() : clock_.Now() + std::chrono::milliseconds(timeout_ms);
  waiters_.push_back({&conn, version, deadline});
}

void StoreService::Tick(Clock::Time now) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (now >= it->deadline) {
      (void)it->conn->SendError(Status::Timeout("version " + std::to_string(it->version) + " not committed in time"));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void StoreService::Disconnected(Connection& conn) {
  store_->ReleaseReservations(conn.id);
  for (uint64_t v : conn.pins) store_->Unpin(v);
  conn.pins.clear();
  waiters_.remove_if([&](const Waiter& w) { return w.conn == &conn; });
}

}  // namespace ftrun
