#include "launcher/agent/rank_hello.h"

#include "plugin/common/bytes.h"

namespace ftrun {

Status RankHello::Decode(const std::string& payload, RankHello* out) {
  ByteReader r(payload);
  out->protocol = r.Get<uint32_t>();
  out->rank = r.Get<int32_t>();
  (void)r.Get<int32_t>();  // the client's pid; SO_PEERCRED is what we trust
  out->job = r.GetString();
  out->role = HelloRole::kRank;
  if (r.ok() && !r.done()) {
    const uint8_t role = r.Get<uint8_t>();
    if (r.ok() && role > static_cast<uint8_t>(HelloRole::kWriter)) {
      return Status::InvalidArgument("hello: role " + std::to_string(role) +
                                     " is neither 0 (the rank) nor 1 (a writer of the rank)");
    }
    out->role = static_cast<HelloRole>(role);
  }
  if (!r.ok() || !r.done()) return Status::Corruption("malformed hello");
  return Status::Ok();
}

Status CheckHello(const RankHello& h, const HelloCheck& c) {
  const std::string rank = std::to_string(h.rank);
  if (h.protocol != c.protocol) {
    return Status::FailedPrecondition("client speaks protocol " + std::to_string(h.protocol) + ", agent " +
                                      std::to_string(c.protocol));
  }
  if (!h.job.empty() && h.job != c.job_id) {
    return Status::FailedPrecondition("client is in job '" + h.job + "', this agent serves job '" + c.job_id + "'");
  }
  if (!c.is_local_rank) {
    return Status::InvalidArgument("rank " + rank + " is not one of this node's ranks (" +
                                   std::to_string(c.first_rank) + ".." +
                                   std::to_string(c.first_rank + c.local_ranks - 1) + ")");
  }
  if (!c.running || c.rank_pid == 0) return Status::Unavailable("rank " + rank + " is being stopped");
  if (c.peer_pgid != c.rank_pid) {
    return Status::FailedPrecondition("pid " + std::to_string(c.peer_pid) + " is not rank " + rank +
                                      "'s process (started by this agent as pid " + std::to_string(c.rank_pid) + ")");
  }
  if (h.role == HelloRole::kWriter) {
    if (c.writers >= kMaxWritersPerRank) {
      return Status::ResourceExhausted("rank " + rank + " has " + std::to_string(c.writers) +
                                       " writers connected (at most " + std::to_string(kMaxWritersPerRank) + ")");
    }
    return Status::Ok();
  }
  if (c.rank_connected) return Status::AlreadyExists("rank " + rank + " is already connected");
  return Status::Ok();
}

std::string EncodeHelloOk(const std::string& job_id, int node, uint64_t chunk_size,
                          std::optional<uint64_t> restore_version) {
  ByteWriter w;
  w.PutString(job_id);
  w.Put<int32_t>(node);
  w.Put<uint64_t>(chunk_size);
  w.Put<uint8_t>(restore_version.has_value());
  w.Put<uint64_t>(restore_version.value_or(0));
  return w.data();
}

}  // namespace ftrun
