// UcxTransport's insides, shared by its .cc files (ucx_transport.h has the
// public face and what is authenticated):
//   ucx_transport.cc    the worker, the listener, the progress thread, and
//                       the queues between it and the owner;
//   ucx_connections.cc  connection bookkeeping: connect, accept (with the
//                       handshake cap), endpoint errors, deadlines, up,
//                       close, and freeing closed connections;
//   ucx_control.cc      control messages: the handshake, then sequenced,
//                       MACed messages (session_frame.h);
//   ucx_bulk.cc         bulk data as session-bound active messages, and the
//                       drain of outsiders' tag messages.
// Internal to plugin/transport (it includes <ucp/api/ucp.h>).
//
// Thread-safety: everything below is touched by the progress thread only,
// except where a member says otherwise.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "plugin/common/fd.h"
#include "plugin/common/wake_queue.h"
#include "plugin/transport/session_frame.h"
#include "plugin/transport/ucx_transport.h"

namespace ftrun {
namespace ucx {

using Clock = std::chrono::steady_clock;

// While bulk data moves (a bulk operation in flight, or one finished this
// recently), the progress thread keeps polling until the worker did nothing
// for this long, then arms the worker and sleeps. Control messages alone
// never keep it polling: at thousands of agents they come every few tens of
// microseconds, and polling through the gaps cost the coordinator a core.
inline constexpr auto kSpinAfterBusy = std::chrono::microseconds(500);
inline constexpr unsigned kAmId = 1;      // control messages
inline constexpr unsigned kBulkAmId = 2;  // bulk data
// Incoming connections still in their handshake (from peers not yet known):
// beyond this many, new ones are accepted and closed soon (kRefuseDelay), so a flood of
// connects that never authenticate cannot grow memory or the deadline scan.
inline constexpr size_t kMaxHandshaking = 64;
// A connection over that cap is closed this long after it was accepted, not
// at once: closing a server endpoint from its connection request, before
// UCX's TCP connection manager finished creating it, trips an assertion
// there (tcp_sockcm_ep.c, seen under ASan with connect/close churn).
inline constexpr std::chrono::milliseconds kRefuseDelay{200};
// How often the handshake deadlines (kRefuseDelay, handshake_timeout) are looked at.
inline constexpr std::chrono::milliseconds kDeadlineCheckEvery{5};

inline Status UcsError(const std::string& what, ucs_status_t st) {
  return Status::Unavailable(what + ": " + ucs_status_string(st));
}
// "IPv4:PORT" to a socket address; errors say what was expected.
Status ParseAddress(const std::string& address, sockaddr_in* out);
std::string FormatAddress(const sockaddr_storage& ss);

class UcxTransport;

struct Conn {
  enum class State { kAwaitChallenge, kAwaitHello, kAwaitWelcome, kUp, kClosed };
  UcxTransport* owner = nullptr;
  ucp_ep_h ep = nullptr;
  State state = State::kAwaitChallenge;
  bool outgoing = false;
  bool refused = false;      // over kMaxHandshaking: closed after kRefuseDelay (CheckDeadlines)
  PeerId peer = 0;           // expected (outgoing) or proven (incoming, once up)
  std::string nonce;         // ours: the challenge (incoming) or hello nonce (outgoing)
  std::string transcript;    // the handshake's (handshake.h), once both nonces are known
  SessionFrames session;     // the session key and sequence numbers, once up
  bool warned_bulk = false;  // logged a dropped bulk send already
  std::string remote;        // for logs
  Clock::time_point started;
  std::vector<std::pair<uint16_t, std::string>> pending;  // sent before up
  void* close_request = nullptr;  // the endpoint's close, while in progress: the Conn is freed after it
};

// One in-flight operation; user_data of its request.
struct Op {
  enum class Kind { kMessage, kBulkSend, kBulkRecv };
  UcxTransport* owner;
  Kind kind;
  uint64_t token = 0;
  uint64_t length = 0;
  PeerId peer = 0;
  std::string header;  // kept alive until completion
  std::string payload;
  void* request = nullptr;
  uint64_t tag = 0;        // receives: posted under
  void* data = nullptr;    // receives: where the bytes go
  bool receiving = false;  // receives: matched, bytes on their way (request set)
};

class UcxTransport : public Transport {
 public:
  explicit UcxTransport(UcxTransportOptions o) : o_(std::move(o)) {}
  ~UcxTransport() override;

  Status Start();

  std::string address() const override { return address_; }
  void Connect(PeerId peer, const std::string& address) override {
    Post([this, peer, address] { DoConnect(peer, address); });
  }
  void Disconnect(PeerId peer) override {
    Post([this, peer] { CloseAll(peer, Status::Unavailable("disconnected by this side")); });
  }
  void Send(PeerId peer, uint16_t type, std::string payload) override {
    stats_.message_bytes += payload.size();
    Post([this, peer, type, p = std::move(payload)]() mutable { DoSend(peer, type, std::move(p)); });
  }
  void SendBulk(PeerId peer, uint64_t tag, const void* data, uint64_t length, uint64_t token) override {
    Post([=] { DoSendBulk(peer, tag, data, length, token); });
  }
  void PostRecv(PeerId peer, uint64_t tag, void* data, uint64_t length, uint64_t token) override {
    Post([=] { DoPostRecv(peer, tag, data, length, token); });
  }
  void CancelRecv(uint64_t token) override {
    Post([this, token] {
      auto it = recvs_.find(token);
      if (it != recvs_.end()) CancelOp(it->second);
    });
  }
  int event_fd() const override { return events_.fd(); }
  std::vector<TransportEvent> Poll() override;
  TransportStats stats() const override {
    TransportStats s;
    s.bulk_bytes_sent = stats_.bulk_sent;
    s.bulk_bytes_received = stats_.bulk_received;
    s.message_bytes_sent = stats_.message_bytes;
    s.connections = stats_.connections;
    s.refused = stats_.refused;
    s.bulk_dropped = stats_.bulk_dropped;
    return s;
  }

  // UCX callbacks (progress thread).
  static void OnConnRequest(ucp_conn_request_h req, void* arg);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t st);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param);
  static ucs_status_t OnBulkAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param);
  static void OnSendDone(void* request, ucs_status_t st, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t st, size_t length, void* user_data);

 private:
  // ucx_transport.cc
  void Post(std::function<void()> fn);
  void Emit(TransportEvent e);
  void Run();
  void RunCommands();

  // ucx_connections.cc
  void CheckDeadlines();
  Conn* NewConn(ucp_ep_h ep, bool outgoing, PeerId peer, std::string remote);
  void DoConnect(PeerId peer, const std::string& address);
  void Refuse(Conn* c, const std::string& what);
  void BecomeUp(Conn* c);
  void CloseConn(Conn* c, const Status& why);
  void CloseAll(PeerId peer, const Status& why);
  void Reap();
  Conn* UpConn(PeerId peer);

  // ucx_control.cc
  void DoSend(PeerId peer, uint16_t type, std::string payload);
  void SendOnConn(Conn* c, uint16_t type, std::string payload);
  void Handshake(Conn* c, uint16_t type, const std::string& payload);
  void Message(Conn* c, const WireHeader& h, std::string payload);

  // ucx_bulk.cc
  void DoSendBulk(PeerId peer, uint64_t tag, const void* data, uint64_t length, uint64_t token);
  void DoPostRecv(PeerId peer, uint64_t tag, void* data, uint64_t length, uint64_t token);
  ucs_status_t Bulk(Conn* c, const void* header, size_t header_length, void* data, size_t length,
                    const ucp_am_recv_param_t* param);
  void DrainTags();
  void CancelOp(Op* op);
  void Finish(Op* op, ucs_status_t st, uint64_t received_length);

  // Constant after Start.
  UcxTransportOptions o_;
  std::string address_;
  UniqueFd epoll_;
  std::thread thread_;
  // Any thread.
  std::atomic<bool> stop_{false};
  // What stats() reports: written by the progress thread (message_bytes: by
  // the caller of Send), read by any.
  struct Counters {
    std::atomic<uint64_t> bulk_sent{0}, bulk_received{0}, message_bytes{0};
    std::atomic<uint64_t> connections{0}, refused{0}, bulk_dropped{0};
  } stats_;

  WakeQueue<std::function<void()>> commands_;  // to the progress thread (its epoll watches the fd)
  WakeQueue<TransportEvent> events_;           // to the owner (event_fd())

  // Progress thread only.
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  // Closed ones stay until their endpoint's close completes (no UCX callback
  // can name them after that), then Reap frees them.
  std::list<std::unique_ptr<Conn>> conns_;
  size_t closed_ = 0;  // of conns_, those closed and not freed yet (Reap has work)
  Clock::time_point next_deadline_check_{};
  std::unordered_map<ucp_ep_h, Conn*> by_ep_;
  std::map<PeerId, Conn*> connecting_;
  std::map<PeerId, std::vector<Conn*>> up_;
  size_t handshaking_in_ = 0;                          // incoming connections in their handshake (kMaxHandshaking)
  std::map<uint64_t, Op*> recvs_;                      // token -> posted receive (matched or not)
  std::map<std::pair<PeerId, uint64_t>, Op*> posted_;  // (peer, tag) -> receive not matched yet
  std::vector<std::pair<Conn*, Status>> failed_;       // ep errors, handled after progress
  int bulk_active_ = 0;                                // bulk sends, and matched receives, in flight
  Clock::time_point last_bulk_done_{};
  uint64_t tags_dropped_ = 0;
  char scratch_[4096];  // where dropped tag messages go (truncated)
};

}  // namespace ucx
}  // namespace ftrun
