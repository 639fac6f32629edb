#include "launcher/agent/rank_hello.h"

namespace ftrun {

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

}  // namespace ftrun
