#include "launcher/agent/rank_requests.h"

#include <unistd.h>

#include "launcher/agent/rank_hello.h"
#include "plugin/common/log.h"

namespace ftrun {

void RankRequests::Frame(Connection& conn, MsgType type, const std::string& payload) {
  const bool warm_type = type >= MsgType::kWarmHello && type <= MsgType::kWarmFailed;
  if (conn.control || warm_type) {  // a control link (warm_ranks.h), not a rank's requests
    if (p_.warm != nullptr) return p_.warm->Frame(conn, type, payload);
    (void)conn.SendError(Status::FailedPrecondition("this agent has no warm recovery"));
    return p_.server->Close(conn.id, "warm hello without warm recovery");
  }
  if (type == MsgType::kHello) return Hello(conn, payload);
  RankProcesses::Slot* slot = conn.rank >= 0 ? p_.ranks->ByRank(conn.rank) : nullptr;
  if (slot == nullptr || conn.generation != p_.generations->generation() || !p_.generations->running()) {
    (void)conn.SendError(Status::FailedPrecondition("connection is not an accepted rank of the current generation"));
    return p_.server->Close(conn.id, "request before hello or from a stopped generation");
  }
  if (conn.writer) return WriterFrame(conn, type, payload);
  slot->last_progress = clock_.Now();
  if (type == MsgType::kProgress) return;
  if (type == MsgType::kSaveStall) {  // no reply: the client does not wait for one
    Status s = p_.stalls != nullptr ? p_.stalls->Report(payload) : Status::Ok();
    if (!s.ok()) FTRUN_LOG_WARN("rank {}: {}; ignored", conn.rank, s.message());
    return;
  }
  if (type == MsgType::kLoadDone) p_.generations->RankEvent(*slot, &RankProcesses::Slot::restored);
  if (type == MsgType::kCorruptChunk) {
    CorruptChunkReport r;
    Status s = CorruptChunkReport::Decode(payload, &r);
    (void)(s.ok() ? conn.Send(MsgType::kCorruptChunkOk, p_.corrupt->Reported(conn.rank, r).message)
                  : conn.SendError(s));
    return;
  }
  if (!p_.service->Handle(conn, type, payload)) {
    (void)conn.SendError(Status::InvalidArgument("unknown request type " + std::to_string(static_cast<int>(type))));
  }
}

// A writer of a rank (rank_hello.h) saves and lists versions; it is not the rank, so nothing it sends is the
// rank's progress, and it neither loads nor reports. Its notices (a save's stall, progress: no reply is
// awaited) are dropped: a writer's stall is not the training's.
void RankRequests::WriterFrame(Connection& conn, MsgType type, const std::string& payload) {
  if (type == MsgType::kSaveStall || type == MsgType::kProgress) return;
  if (type == MsgType::kAlloc || type == MsgType::kSave || type == MsgType::kList || type == MsgType::kWaitCommitted) {
    (void)p_.service->Handle(conn, type, payload);
    return;
  }
  (void)conn.SendError(Status::FailedPrecondition("a writer of rank " + std::to_string(conn.rank) +
                                                  " saves and lists versions only (request type " +
                                                  std::to_string(static_cast<int>(type)) + ")"));
}

void RankRequests::Hello(Connection& conn, const std::string& payload) {
  const Place place = place_();
  RankHello h;
  Status s = RankHello::Decode(payload, &h);
  RankProcesses::Slot* slot = s.ok() ? p_.ranks->ByRank(h.rank) : nullptr;
  if (s.ok()) {
    HelloCheck c;
    c.protocol = kProtocolVersion;
    c.job_id = place.job_id;
    c.first_rank = place.first_rank;
    c.local_ranks = place.local_ranks;
    c.running = p_.generations->running();
    c.is_local_rank = slot != nullptr;
    c.rank_pid = slot ? slot->pid : 0;
    c.rank_connected = slot && slot->conn_id != 0;
    c.writers = static_cast<int>(p_.server->Count([&](const Connection& x) { return x.writer && x.rank == h.rank; }));
    c.peer_pid = conn.pid;
    c.peer_pgid = ::getpgid(conn.pid);
    s = CheckHello(h, c);
  }
  if (!s.ok()) {
    FTRUN_LOG_WARN("refused hello from pid {}: {}", conn.pid, s.message());
    (void)conn.SendError(s);
    return p_.server->Close(conn.id, "hello refused");
  }
  conn.rank = h.rank;
  conn.reader.set_max_frame(Connection::kMaxRankFrame);
  conn.generation = p_.generations->generation();
  conn.writer = h.role == HelloRole::kWriter;
  if (conn.writer) {
    FTRUN_LOG_INFO("pid {} writes for rank {}", conn.pid, h.rank);
    (void)conn.Send(MsgType::kHelloOk,
                    Encode(HelloOkMsg{place.job_id, place.node_rank, place.chunk_size, std::nullopt}), place.store_fd);
    return;
  }
  slot->conn_id = conn.id;
  slot->last_progress = clock_.Now();
  (void)conn.Send(
      MsgType::kHelloOk,
      Encode(HelloOkMsg{place.job_id, place.node_rank, place.chunk_size, p_.generations->restore_version()}),
      place.store_fd);
  p_.generations->RankEvent(*slot, &RankProcesses::Slot::connected);
}

void RankRequests::Closed(Connection& conn) {
  if (conn.control) {
    if (p_.warm != nullptr) p_.warm->Closed(conn);
    return;
  }
  p_.service->Disconnected(conn);
  RankProcesses::Slot* slot = conn.rank >= 0 ? p_.ranks->ByRank(conn.rank) : nullptr;
  if (slot && slot->conn_id == conn.id) slot->conn_id = 0;
}

}  // namespace ftrun
