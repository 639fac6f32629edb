// RankServer: the agent's unix socket for its ranks. Accepts connections
// from this uid only (SO_PEERCRED), bounds how many may be open without
// having said hello and closes those silent past kHelloDeadline, reads each
// connection's frames within a per-wakeup budget (level-triggered epoll:
// the rest waits while other ranks are served), counts them against the
// flood limits, and cuts off a peer that breaks the protocol. Replies are
// queued and written as the socket takes them.
//
// What a frame means (a hello, a save) is the agent's: each decoded frame
// goes to on_frame, and on_close runs before a connection goes.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "launcher/agent/connection.h"
#include "launcher/common/event_loop.h"
#include "plugin/common/clock.h"

namespace ftrun {

class RankServer {
 public:
  static constexpr std::chrono::seconds kHelloDeadline{10};
  // Epoll tags below this are the loop's fixed event sources; connections
  // get the ones from here on.
  static constexpr uint64_t kFirstConnTag = 16;

  struct Handler {
    std::function<void(Connection&, MsgType, const std::string&)> on_frame;
    std::function<void(Connection&)> on_close;
  };

  RankServer(EventLoop* loop, const Clock& clock, Handler handler);

  // Listens on `path` (created; the caller removed a stale one), polled in
  // the loop under `tag`.
  Status Listen(const std::string& path, uint64_t tag);
  // How many connections may be open before their hello (at least 64).
  void set_max_pending_hello(size_t n) { max_pending_hello_ = n; }

  // Events of the loop: the listening socket, a connection's tag.
  void Accept();
  bool Owns(uint64_t tag) const { return tag >= kFirstConnTag; }
  void Ready(uint64_t tag, uint32_t events);
  // After each batch of events: poll for EPOLLOUT where replies are queued,
  // close connections whose writes failed.
  void Sync();
  // Silent connections past their hello deadline; a paused listen resumes.
  void Tick();

  // A peer that broke the protocol: told why, and closed.
  void Drop(Connection& conn, const Status& why);
  void Close(uint64_t id, const std::string& why);
  // Every connection but the warm control links (connection.h).
  void CloseAll(const std::string& why);
  Connection* Find(uint64_t id);
  size_t Count(const std::function<bool(const Connection&)>& which) const;
  size_t size() const { return conns_.size(); }

 private:
  void Readable(uint64_t id);

  EventLoop* loop_;
  const Clock& clock_;
  Handler handler_;
  UniqueFd listen_;
  uint64_t listen_tag_ = 0;
  UniqueFd spare_fd_;  // given up to refuse a connection when out of fds
  std::optional<Clock::Time> listen_paused_until_;
  std::map<uint64_t, std::unique_ptr<Connection>> conns_;
  size_t max_pending_hello_ = 64;
  uint64_t refused_pending_ = 0;  // connections refused: too many without a hello
  uint64_t next_id_ = kFirstConnTag;
};

}  // namespace ftrun
