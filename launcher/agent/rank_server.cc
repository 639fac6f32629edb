#include "launcher/agent/rank_server.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "plugin/common/log.h"
#include "plugin/ipc/unix_socket.h"

namespace ftrun {

RankServer::RankServer(EventLoop* loop, const Clock& clock, Handler handler)
    : loop_(loop), clock_(clock), handler_(std::move(handler)) {}

Status RankServer::Listen(const std::string& path, uint64_t tag) {
  FTRUN_RETURN_IF_ERROR(ListenUnix(path, &listen_));
  spare_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  listen_tag_ = tag;
  return loop_->Add(listen_.get(), tag);
}

void RankServer::Accept() {
  while (true) {
    UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      if ((errno == EMFILE || errno == ENFILE) && spare_fd_.valid()) {
        // Out of descriptors: refuse one pending connection (free the spare
        // fd, accept, close, take the spare back) rather than spin on a
        // listen socket that stays readable.
        spare_fd_.Reset();
        bool dropped = UniqueFd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC)).valid();
        spare_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (dropped) {
          FTRUN_LOG_ERROR("out of file descriptors: refused a connection");
          continue;
        }
      } else if (errno == EMFILE || errno == ENFILE) {
        // No spare either: stop listening for a while (Tick resumes it).
        FTRUN_LOG_ERROR("out of file descriptors: not accepting connections for 1 s");
        loop_->Remove(listen_.get());
        listen_paused_until_ = clock_.Now() + std::chrono::seconds(1);
      }
      return;  // EAGAIN, or a transient error such as ECONNABORTED
    }
    PeerCredentials cred{};
    Status s = GetPeerCredentials(fd.get(), &cred);
    if (!s.ok() || cred.uid != ::getuid()) {
      FTRUN_LOG_WARN("refused a connection from pid {} uid {}: only uid {} may use this agent", cred.pid, cred.uid,
                     ::getuid());
      continue;
    }
    // Connections that have not said hello cost a descriptor and a buffer
    // each, and any process of our uid can open them: bounded.
    size_t pending = 0;
    for (const auto& [id, c] : conns_) pending += !c->greeted();
    const size_t limit = std::max<size_t>(64, max_pending_hello_);
    if (pending >= limit) {
      if (refused_pending_++ % 100 == 0) {
        FTRUN_LOG_WARN(
            "refused a connection from pid {}: {} connections have not said hello yet (limit {}; "
            "{} refused so far)",
            cred.pid, pending, limit, refused_pending_);
      }
      continue;
    }
    auto conn = std::make_unique<Connection>();
    conn->reader.set_max_frame(Connection::kMaxHelloFrame);
    conn->id = next_id_++;
    conn->fd = std::move(fd);
    conn->pid = cred.pid;
    conn->accepted = clock_.Now();
    if (!loop_->Add(conn->fd.get(), conn->id, EPOLLIN | EPOLLRDHUP).ok()) continue;
    conns_[conn->id] = std::move(conn);
  }
}

void RankServer::Ready(uint64_t tag, uint32_t events) {
  if (events & EPOLLOUT) {
    if (Connection* c = Find(tag)) (void)c->Flush();
  }
  if (events & ~static_cast<uint32_t>(EPOLLOUT)) Readable(tag);
}

void RankServer::Readable(uint64_t id) {
  Connection* c = Find(id);
  if (c == nullptr) return;
  Connection& conn = *c;
  // At most kReadBudget bytes per wakeup: epoll is level-triggered, so the
  // rest is read on a later round, after the other connections had theirs.
  Status read = conn.reader.ReadFrom(conn.fd.get(), Connection::kReadBudget);
  MsgType type;
  std::string payload;
  const auto now = clock_.Now();
  // Frames that arrived before a close still count (e.g. a last save).
  while (conns_.count(id) && conn.reader.Next(&type, &payload)) {
    Status rate = conn.Received(now, payload.size());
    if (!rate.ok()) return Drop(conn, rate);
    handler_.on_frame(conn, type, payload);
  }
  if (!conns_.count(id)) return;
  if (!conn.reader.status().ok()) return Drop(conn, conn.reader.status());
  if (!read.ok() && read.code() != Code::kUnavailable) return Drop(conn, read);
  if (!read.ok()) Close(id, read.message());
}

void RankServer::Drop(Connection& conn, const Status& why) {
  FTRUN_LOG_WARN("dropped the connection of {} (pid {}): {}",
                 conn.rank >= 0 ? "rank " + std::to_string(conn.rank) : std::string("a client before hello"), conn.pid,
                 why.message());
  (void)conn.SendError(why);
  Close(conn.id, why.message());
}

void RankServer::Sync() {
  std::vector<uint64_t> broken;
  for (auto& [id, conn] : conns_) {
    if (conn->broken) {
      broken.push_back(id);
      continue;
    }
    if (conn->want_write == conn->polling_write) continue;
    const uint32_t events = EPOLLIN | EPOLLRDHUP | (conn->want_write ? EPOLLOUT : 0u);
    if (loop_->Modify(conn->fd.get(), id, events).ok()) conn->polling_write = conn->want_write;
  }
  for (uint64_t id : broken) Close(id, "a send to it failed");
}

void RankServer::Tick() {
  const auto now = clock_.Now();
  if (listen_paused_until_ && now >= *listen_paused_until_) {
    listen_paused_until_.reset();
    (void)loop_->Add(listen_.get(), listen_tag_);
  }
  // A connection that never says hello (not a rank, or a stuck one) must
  // not hold a descriptor forever.
  std::vector<uint64_t> silent;
  for (const auto& [id, conn] : conns_) {
    if (!conn->greeted() && now - conn->accepted > kHelloDeadline) silent.push_back(id);
  }
  for (uint64_t id : silent) Close(id, "no hello within 10 s");
}

void RankServer::Close(uint64_t id, const std::string& why) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Connection& conn = *it->second;
  FTRUN_LOG_DEBUG("connection {} (rank {}) closed: {}", id, conn.rank, why);
  if (handler_.on_close) handler_.on_close(conn);
  loop_->Remove(conn.fd.get());
  conns_.erase(it);
}

void RankServer::CloseAll(const std::string& why) {
  std::vector<uint64_t> ids;
  for (const auto& [id, conn] : conns_) {
    if (!conn->control) ids.push_back(id);
  }
  for (uint64_t id : ids) Close(id, why);
}

Connection* RankServer::Find(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

size_t RankServer::Count(const std::function<bool(const Connection&)>& which) const {
  size_t n = 0;
  for (const auto& [id, conn] : conns_) n += which(*conn) ? 1 : 0;
  return n;
}

}  // namespace ftrun
