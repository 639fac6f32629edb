#include "plugin/transport/ucx_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "plugin/common/bytes.h"
#include "plugin/common/fd.h"
#include "plugin/common/log.h"
#include "plugin/transport/handshake.h"

namespace ftrun {
namespace {

using Clock = std::chrono::steady_clock;

// How long the progress thread keeps polling after the worker last did
// something, before it arms the worker and sleeps.
constexpr auto kSpinAfterBusy = std::chrono::microseconds(500);
constexpr unsigned kAmId = 1;      // control messages
constexpr unsigned kBulkAmId = 2;  // bulk data
// Handshake message types, above every application type.
constexpr uint16_t kChallenge = 0xFF01;  // acceptor -> connector: nonce
constexpr uint16_t kHello = 0xFF02;      // connector -> acceptor: id, nonce, mac
constexpr uint16_t kWelcome = 0xFF03;    // acceptor -> connector: id, mac
// Incoming connections still in their handshake (from peers not yet known):
// beyond this many, new ones are accepted and closed at once, so a flood of
// connects that never authenticate cannot grow memory or the deadline scan.
constexpr size_t kMaxHandshaking = 64;

// The header of every control message. Handshake messages carry seq 0 and
// no MAC (their payload is the proof); every later one carries
// MessageMac(session key, direction, seq, type, payload) (handshake.h).
struct WireHeader {
  uint32_t type;
  uint32_t reserved;
  uint64_t seq;
  char mac[kMacBytes];
};
static_assert(std::is_trivially_copyable_v<WireHeader>);

// The header of a bulk send: the receiver's tag and BulkMac(session key,
// direction, tag, length).
//
// Why bulk is an active message and not a tag send: a tag receive is posted
// on the whole worker and matches any sender's tag, so a connection that
// never authenticated could pre-send tags (they wait in the worker's
// unexpected queue, unbounded) and have its bytes land in a later transfer.
// An active message arrives with the endpoint it came from, so the handler
// accepts it only from a connection that finished the handshake, only for a
// receive posted for that connection's peer and tag, and only with a header
// MACed under that connection's session key; anything else is dropped on the
// spot (an eager payload is released when the handler returns, a rendezvous
// one is never fetched), so nothing is buffered for it. The bytes themselves
// are not MACed (the replicator checks every chunk's content hash); the
// header MAC binds them to the session, so another connection's bytes are
// never accepted. No tag receive is ever posted: every tag send that reaches
// us is an outsider's, and DrainTags drops it (see there).
struct BulkHeader {
  uint64_t tag;
  char mac[kMacBytes];
};
static_assert(std::is_trivially_copyable_v<BulkHeader>);

Status UcsError(const std::string& what, ucs_status_t st) {
  return Status::Unavailable(what + ": " + ucs_status_string(st));
}

Status ParseAddress(const std::string& address, sockaddr_in* out) {
  auto colon = address.rfind(':');
  std::memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  int port = -1;
  if (colon != std::string::npos) {
    try {
      port = std::stoi(address.substr(colon + 1));
    } catch (...) {
      port = -1;
    }
  }
  if (colon == std::string::npos || port <= 0 || port > 65535 ||
      ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &out->sin_addr) != 1) {
    return Status::InvalidArgument("bad peer address '" + address + "': expected IPv4:PORT, e.g. 10.0.0.2:41000");
  }
  out->sin_port = htons(static_cast<uint16_t>(port));
  return Status::Ok();
}

std::string FormatAddress(const sockaddr_storage& ss) {
  if (ss.ss_family != AF_INET) return "?";
  const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(in->sin_port));
}

class UcxTransport;

struct Conn {
  enum class State { kAwaitChallenge, kAwaitHello, kAwaitWelcome, kUp, kClosed };
  UcxTransport* owner = nullptr;
  ucp_ep_h ep = nullptr;
  State state = State::kAwaitChallenge;
  bool outgoing = false;
  PeerId peer = 0;     // expected (outgoing) or proven (incoming, once up)
  std::string nonce;   // ours: the challenge (incoming) or hello nonce (outgoing)
  std::string transcript;  // the handshake's (handshake.h), once both nonces are known
  std::string key;         // the session key, once up
  uint64_t send_seq = 0, recv_seq = 0;  // next control message sequence numbers, per direction
  bool warned_bulk = false;             // logged a dropped bulk send already
  std::string remote;  // for logs
  Clock::time_point started;
  std::vector<std::pair<uint16_t, std::string>> pending;  // sent before up
  void* close_request = nullptr;  // the endpoint's close, while in progress: the Conn is freed after it

  Direction sending() const { return outgoing ? Direction::kFromConnector : Direction::kFromAcceptor; }
  Direction receiving() const { return outgoing ? Direction::kFromAcceptor : Direction::kFromConnector; }
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
    stats_message_bytes_ += payload.size();
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
  int event_fd() const override { return event_fd_.get(); }
  std::vector<TransportEvent> Poll() override;
  TransportStats stats() const override {
    TransportStats s;
    s.bulk_bytes_sent = stats_bulk_sent_;
    s.bulk_bytes_received = stats_bulk_received_;
    s.message_bytes_sent = stats_message_bytes_;
    s.connections = stats_connections_;
    s.refused = stats_refused_;
    s.bulk_dropped = stats_bulk_dropped_;
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
  void Post(std::function<void()> fn);
  void Emit(TransportEvent e);
  void Run();
  void RunCommands();
  void CheckDeadlines();

  Conn* NewConn(ucp_ep_h ep, bool outgoing, PeerId peer, std::string remote);
  void DoConnect(PeerId peer, const std::string& address);
  void DoSend(PeerId peer, uint16_t type, std::string payload);
  void SendOnConn(Conn* c, uint16_t type, std::string payload);
  void DoSendBulk(PeerId peer, uint64_t tag, const void* data, uint64_t length, uint64_t token);
  void DoPostRecv(PeerId peer, uint64_t tag, void* data, uint64_t length, uint64_t token);
  void Handshake(Conn* c, uint16_t type, const std::string& payload);
  void Message(Conn* c, const WireHeader& h, std::string payload);
  ucs_status_t Bulk(Conn* c, const void* header, size_t header_length, void* data, size_t length,
                    const ucp_am_recv_param_t* param);
  void Refuse(Conn* c, const std::string& what);
  void BecomeUp(Conn* c);
  void CloseConn(Conn* c, const Status& why);
  void CloseAll(PeerId peer, const Status& why);
  void Reap();
  void DrainTags();
  void CancelOp(Op* op);
  void Finish(Op* op, ucs_status_t st, uint64_t received_length);
  Conn* UpConn(PeerId peer);

  UcxTransportOptions o_;
  std::string address_;
  UniqueFd event_fd_;    // owner-facing: events waiting
  UniqueFd command_fd_;  // progress thread: commands waiting
  UniqueFd epoll_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> stats_bulk_sent_{0}, stats_bulk_received_{0}, stats_message_bytes_{0};
  std::atomic<uint64_t> stats_connections_{0}, stats_refused_{0}, stats_bulk_dropped_{0};

  std::mutex mu_;  // guards commands_ and events_
  std::vector<std::function<void()>> commands_;
  std::vector<TransportEvent> events_;

  // Progress thread only.
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  // Closed ones stay until their endpoint's close completes (no UCX callback
  // can name them after that), then Reap frees them.
  std::list<std::unique_ptr<Conn>> conns_;
  std::unordered_map<ucp_ep_h, Conn*> by_ep_;
  std::map<PeerId, Conn*> connecting_;
  std::map<PeerId, std::vector<Conn*>> up_;
  size_t handshaking_in_ = 0;      // incoming connections in their handshake (kMaxHandshaking)
  std::map<uint64_t, Op*> recvs_;  // token -> posted receive (matched or not)
  std::map<std::pair<PeerId, uint64_t>, Op*> posted_;  // (peer, tag) -> receive not matched yet
  std::vector<std::pair<Conn*, Status>> failed_;  // ep errors, handled after progress
  uint64_t tags_dropped_ = 0;
  char scratch_[4096];  // where dropped tag messages go (truncated)
};

UcxTransport::~UcxTransport() {
  stop_ = true;
  uint64_t one = 1;
  if (command_fd_.valid()) (void)!::write(command_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  if (listener_) ucp_listener_destroy(listener_);
  if (worker_) {
    // Force-close what is left and let the closes complete.
    for (auto& c : conns_) {
      void* r = c->close_request;
      c->close_request = nullptr;
      if (r == nullptr && c->state != Conn::State::kClosed && c->ep != nullptr) {
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
        r = ucp_ep_close_nbx(c->ep, &p);
      }
      if (UCS_PTR_IS_PTR(r)) {
        auto deadline = Clock::now() + std::chrono::seconds(1);
        while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) ucp_worker_progress(worker_);
        ucp_request_free(r);
      }
    }
    std::vector<void*> cancel;
    for (auto& [token, op] : recvs_) {
      if (op->receiving) cancel.push_back(op->request);
    }
    for (void* r : cancel) ucp_request_cancel(worker_, r);
    for (int i = 0; i < 100; ++i) ucp_worker_progress(worker_);
    ucp_worker_destroy(worker_);
  }
  for (auto& [token, op] : recvs_) delete op;  // the worker is gone: no callback can name them
  if (context_) ucp_cleanup(context_);
}

Status UcxTransport::Start() {
  // SO_REUSEADDR on the listener: a runner taking over a job listens on its
  // dead predecessor's port, whose accepted connections sit in TIME_WAIT;
  // Linux lets that bind through only when both sockets had the option.
  // UCX reads UCT settings from the environment only; a user's own wins.
  ::setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcsError("ucp_config_read", st);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  // Tags only so that a tag send to us lands where DrainTags drops it
  // (without the feature UCT logs a warning with a backtrace for each).
  params.features = UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcsError("ucp_init", st);

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return UcsError("ucp_worker_create", st);

  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kAmId;
  hp.cb = &UcxTransport::OnAm;
  hp.arg = this;
  st = ucp_worker_set_am_recv_handler(worker_, &hp);
  if (st != UCS_OK) return UcsError("ucp_worker_set_am_recv_handler", st);
  hp.id = kBulkAmId;
  hp.cb = &UcxTransport::OnBulkAm;
  st = ucp_worker_set_am_recv_handler(worker_, &hp);
  if (st != UCS_OK) return UcsError("ucp_worker_set_am_recv_handler", st);

  sockaddr_in sa{};
  FTRUN_RETURN_IF_ERROR(ParseAddress(o_.listen_ip + ":1", &sa));
  sa.sin_port = htons(o_.listen_port);
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  lp.sockaddr.addrlen = sizeof(sa);
  lp.conn_handler.cb = &UcxTransport::OnConnRequest;
  lp.conn_handler.arg = this;
  st = ucp_listener_create(worker_, &lp, &listener_);
  if (st != UCS_OK) {
    return UcsError("cannot listen for peers on " + o_.listen_ip + ":" + std::to_string(o_.listen_port), st);
  }
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(listener_, &la);
  if (st != UCS_OK) return UcsError("ucp_listener_query", st);
  address_ = FormatAddress(la.sockaddr);

  int efd = -1;
  st = ucp_worker_get_efd(worker_, &efd);
  if (st != UCS_OK) return UcsError("ucp_worker_get_efd", st);
  event_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  command_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!event_fd_.valid() || !command_fd_.valid() || !epoll_.valid()) return Status::FromErrno("eventfd/epoll", errno);
  for (int fd : {efd, command_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl", errno);
  }
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void UcxTransport::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> l(mu_);
    commands_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  (void)!::write(command_fd_.get(), &one, sizeof(one));
}

void UcxTransport::Emit(TransportEvent e) {
  {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back(std::move(e));
  }
  uint64_t one = 1;
  (void)!::write(event_fd_.get(), &one, sizeof(one));
}

std::vector<TransportEvent> UcxTransport::Poll() {
  uint64_t n;
  (void)!::read(event_fd_.get(), &n, sizeof(n));
  std::lock_guard<std::mutex> l(mu_);
  return std::exchange(events_, {});
}

void UcxTransport::Run() {
  epoll_event evs[4];
  Clock::time_point last_busy{};
  while (!stop_) {
    // Bounded: under a stream of bulk traffic progress never runs dry, and
    // queued commands (a heartbeat) must not starve behind it.
    int progressed = 0;
    while (progressed < 64 && ucp_worker_progress(worker_) != 0) ++progressed;
    if (progressed > 0) last_busy = Clock::now();
    for (auto& [c, why] : std::exchange(failed_, {})) CloseConn(c, why);
    DrainTags();
    Reap();
    RunCommands();
    CheckDeadlines();
    // While bytes are moving, poll instead of sleeping: arming the worker and
    // waking from epoll per completion costs more than the wait it saves.
    // Sleep once nothing has happened for kSpinAfterBusy.
    if (Clock::now() - last_busy < kSpinAfterBusy) {
      ::sched_yield();  // a thread with work (the agent hashing what landed) goes first
      continue;
    }
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    int n = ::epoll_wait(epoll_.get(), evs, 4, 100);
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == command_fd_.get()) {
        uint64_t v;
        (void)!::read(command_fd_.get(), &v, sizeof(v));
      }
    }
  }
}

void UcxTransport::RunCommands() {
  std::vector<std::function<void()>> cmds;
  {
    std::lock_guard<std::mutex> l(mu_);
    cmds.swap(commands_);
  }
  for (auto& fn : cmds) fn();
}

void UcxTransport::CheckDeadlines() {
  auto now = Clock::now();
  for (auto& c : conns_) {
    if (c->state == Conn::State::kUp || c->state == Conn::State::kClosed) continue;
    if (now - c->started > o_.handshake_timeout) {
      CloseConn(c.get(), Status::Timeout("no handshake with " + c->remote + " within " +
                                         std::to_string(o_.handshake_timeout.count()) + " ms"));
    }
  }
}

Conn* UcxTransport::NewConn(ucp_ep_h ep, bool outgoing, PeerId peer, std::string remote) {
  auto c = std::make_unique<Conn>();
  c->owner = this;
  c->ep = ep;
  c->outgoing = outgoing;
  c->peer = peer;
  c->remote = std::move(remote);
  c->started = Clock::now();
  c->state = outgoing ? Conn::State::kAwaitChallenge : Conn::State::kAwaitHello;
  if (!outgoing) ++handshaking_in_;
  Conn* raw = c.get();
  conns_.push_back(std::move(c));
  stats_connections_ = conns_.size();
  return raw;
}

// Bulk data is active messages (BulkHeader); this transport never posts a
// tag receive, so a tag message in the worker's unexpected queue is an
// outsider's (the old wire's tags, or an attack). Each is received,
// truncated, into a scratch buffer and dropped, a bounded number per pass:
// the queue cannot grow, and a rendezvous one is never fetched.
void UcxTransport::DrainTags() {
  for (int i = 0; i < 256; ++i) {
    ucp_tag_recv_info_t info;
    ucp_tag_message_h m = ucp_tag_probe_nb(worker_, 0, 0, 1, &info);
    if (m == nullptr) return;
    ++stats_bulk_dropped_;
    if (tags_dropped_++ % 10000 == 0) {
      FTRUN_LOG_WARN("dropped a tag message ({} bytes, tag {}) from an unknown sender: agents send none ({} so far)",
                     info.length, info.sender_tag, tags_dropped_);
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    p.cb.recv = [](void* request, ucs_status_t, const ucp_tag_recv_info_t*, void*) { ucp_request_free(request); };
    (void)ucp_tag_msg_recv_nbx(worker_, scratch_, sizeof(scratch_), m, &p);  // a request frees itself when done
  }
}

// Frees the closed connections whose endpoint is gone: after its close
// completed, no UCX callback can name the Conn (the error handler's arg).
// Runs only from the progress loop, after the endpoint errors were handled,
// never inside a callback or a loop over conns_.
void UcxTransport::Reap() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn* c = it->get();
    if (c->state != Conn::State::kClosed) {
      ++it;
      continue;
    }
    if (c->close_request != nullptr) {
      if (ucp_request_check_status(c->close_request) == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(c->close_request);
      c->close_request = nullptr;
    }
    it = conns_.erase(it);
  }
  stats_connections_ = conns_.size();
}

void UcxTransport::DoConnect(PeerId peer, const std::string& address) {
  if (connecting_.count(peer) || UpConn(peer)) return;
  sockaddr_in sa;
  Status s = ParseAddress(address, &sa);
  if (!s.ok()) {
    Emit({TransportEvent::Kind::kPeerDown, peer, 0, {}, 0, s});
    return;
  }
  Conn* c = NewConn(nullptr, true, peer, address);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep.sockaddr.addrlen = sizeof(sa);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxTransport::OnEpError;
  ep.err_handler.arg = c;
  ucs_status_t st = ucp_ep_create(worker_, &ep, &c->ep);
  if (st != UCS_OK) {
    c->ep = nullptr;
    c->state = Conn::State::kClosed;
    Emit({TransportEvent::Kind::kPeerDown, peer, 0, {}, 0, UcsError("cannot connect to " + address, st)});
    return;
  }
  by_ep_[c->ep] = c;
  connecting_[peer] = c;
}

void UcxTransport::OnConnRequest(ucp_conn_request_h req, void* arg) {
  auto* self = static_cast<UcxTransport*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string remote = "?";
  if (ucp_conn_request_query(req, &attr) == UCS_OK) remote = FormatAddress(attr.client_address);
  // Over the cap the connection is accepted and closed at once (UCX 1.13's
  // ucp_listener_reject can trip an assertion in its TCP connection manager
  // when the client goes away meanwhile); the Conn is freed once closed.
  const bool over_cap = self->handshaking_in_ >= kMaxHandshaking;
  Conn* c = self->NewConn(nullptr, false, 0, remote);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxTransport::OnEpError;
  ep.err_handler.arg = c;
  ucs_status_t st = ucp_ep_create(self->worker_, &ep, &c->ep);
  if (st != UCS_OK) {
    c->ep = nullptr;
    self->CloseConn(c, UcsError("accept", st));
    FTRUN_LOG_WARN("cannot accept a connection from {}: {}", remote, ucs_status_string(st));
    return;
  }
  self->by_ep_[c->ep] = c;
  if (over_cap) {
    if (self->stats_refused_++ % 1000 == 0) {
      FTRUN_LOG_WARN("refused a connection from {}: {} connections are already in their handshake", remote,
                     kMaxHandshaking);
    }
    return self->CloseConn(c, Status::Unavailable("too many connections in their handshake"));
  }
  c->nonce = NewNonce();
  self->SendOnConn(c, kChallenge, c->nonce);
}

void UcxTransport::OnEpError(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* c = static_cast<Conn*>(arg);
  c->owner->failed_.push_back({c, UcsError("connection with " + c->remote + " failed", st)});
}

ucs_status_t UcxTransport::OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return rndv ? UCS_ERR_UNSUPPORTED : UCS_OK;  // not ours
  auto it = self->by_ep_.find(param->reply_ep);
  if (it == self->by_ep_.end() || it->second->state == Conn::State::kClosed) return rndv ? UCS_ERR_UNSUPPORTED : UCS_OK;
  Conn* c = it->second;
  if (header_length != sizeof(WireHeader) || rndv) {  // messages are always eager
    self->Refuse(c, "a malformed message (" + std::to_string(header_length) + "-byte header)");
    return rndv ? UCS_ERR_UNSUPPORTED : UCS_OK;
  }
  WireHeader h;
  std::memcpy(&h, header, sizeof(h));
  std::string payload(static_cast<const char*>(data), length);
  if (c->state != Conn::State::kUp) {
    self->Handshake(c, static_cast<uint16_t>(h.type), payload);
  } else {
    self->Message(c, h, std::move(payload));
  }
  return UCS_OK;
}

// A control message on a connection that is up: only in sequence and with
// the session's MAC (handshake.h); anything else closes the connection.
void UcxTransport::Message(Conn* c, const WireHeader& h, std::string payload) {
  if (h.type >= kChallenge) return Refuse(c, "a handshake message after the handshake");
  if (!MacEqual(std::string_view(h.mac, kMacBytes), MessageMac(c->key, c->receiving(), h.seq, h.type, payload))) {
    return Refuse(c, "a message of type " + std::to_string(h.type) + " whose MAC does not match the session key "
                     "(forged or tampered)");
  }
  if (h.seq != c->recv_seq) {
    return Refuse(c, "a message out of sequence (number " + std::to_string(h.seq) + ", expected " +
                         std::to_string(c->recv_seq) + "): replayed or reordered");
  }
  ++c->recv_seq;
  Emit({TransportEvent::Kind::kMessage, c->peer, static_cast<uint16_t>(h.type), std::move(payload), 0, {}});
}

void UcxTransport::Refuse(Conn* c, const std::string& what) {
  ++stats_refused_;
  std::string who = c->state == Conn::State::kUp || c->outgoing ? "peer " + std::to_string(c->peer) + " at " + c->remote
                                                                 : "an unauthenticated peer at " + c->remote;
  FTRUN_LOG_WARN("refused {} from {}; closing the connection", what, who);
  CloseConn(c, Status::FailedPrecondition("refused " + what + " from " + who));
}

ucs_status_t UcxTransport::OnBulkAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                    const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  Conn* c = nullptr;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    auto it = self->by_ep_.find(param->reply_ep);
    if (it != self->by_ep_.end()) c = it->second;
  }
  return self->Bulk(c, header, header_length, data, length, param);
}

// Returns what OnBulkAm returns: UCS_OK for an eager payload (copied, or
// dropped), UCS_INPROGRESS for a rendezvous being received, an error for a
// rendezvous refused (the sender's send fails with it; nothing is fetched).
ucs_status_t UcxTransport::Bulk(Conn* c, const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  const ucs_status_t drop = rndv ? UCS_ERR_REJECTED : UCS_OK;
  if (c == nullptr || c->state != Conn::State::kUp) {
    // Not authenticated: dropped here, nothing kept. Logged once per connection.
    ++stats_bulk_dropped_;
    if (c != nullptr && !c->warned_bulk) {
      c->warned_bulk = true;
      FTRUN_LOG_WARN("dropped bulk data from {}: it has not authenticated", c->remote);
    }
    return drop;
  }
  BulkHeader h;
  if (header_length != sizeof(h)) {
    ++stats_bulk_dropped_;
    Refuse(c, "bulk data with a malformed header");
    return drop;
  }
  std::memcpy(&h, header, sizeof(h));
  if (!MacEqual(std::string_view(h.mac, kMacBytes), BulkMac(c->key, c->receiving(), h.tag, length))) {
    ++stats_bulk_dropped_;
    Refuse(c, "bulk data whose header MAC does not match the session key");
    return drop;
  }
  auto it = posted_.find({c->peer, h.tag});
  if (it == posted_.end()) {
    ++stats_bulk_dropped_;
    if (!c->warned_bulk) {
      c->warned_bulk = true;
      FTRUN_LOG_WARN("dropped bulk data from peer {} at {}: no receive posted for tag {}", c->peer, c->remote, h.tag);
    }
    return drop;
  }
  Op* op = it->second;
  posted_.erase(it);
  if (length != op->length) {  // Finish names both lengths
    recvs_.erase(op->token);
    Finish(op, UCS_OK, length);
    return drop;
  }
  if (!rndv) {
    std::memcpy(op->data, data, length);
    recvs_.erase(op->token);
    Finish(op, UCS_OK, length);
    return UCS_OK;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &UcxTransport::OnRecvDone;
  p.user_data = op;
  void* r = ucp_am_recv_data_nbx(worker_, data, op->data, length, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {  // done at once, or failed (UCP owns the descriptor either way)
    recvs_.erase(op->token);
    Finish(op, r == nullptr ? UCS_OK : UCS_PTR_STATUS(r), r == nullptr ? length : 0);
  } else {
    op->request = r;
    op->receiving = true;
  }
  return UCS_INPROGRESS;
}

void UcxTransport::Handshake(Conn* c, uint16_t type, const std::string& payload) {
  ByteReader r(payload);
  if (c->outgoing && c->state == Conn::State::kAwaitChallenge && type == kChallenge &&
      payload.size() == kNonceBytes) {
    c->nonce = NewNonce();
    // Bound to both nonces and both ids: the id is the one this side meant
    // to reach, so the hello is worthless to anyone else.
    c->transcript = HandshakeTranscript(payload, c->nonce, o_.self, c->peer);
    ByteWriter w;
    w.Put<uint32_t>(o_.self);
    w.PutString(c->nonce);
    w.PutString(HandshakeMac(o_.secret, "hello", c->transcript));
    SendOnConn(c, kHello, w.data());
    c->state = Conn::State::kAwaitWelcome;
    return;
  }
  if (!c->outgoing && c->state == Conn::State::kAwaitHello && type == kHello) {
    uint32_t id = r.Get<uint32_t>();
    std::string their_nonce = r.GetString();
    std::string mac = r.GetString();
    std::string transcript = HandshakeTranscript(c->nonce, their_nonce, id, o_.self);
    if (!r.ok() || their_nonce.size() != kNonceBytes || !MacEqual(mac, HandshakeMac(o_.secret, "hello", transcript))) {
      ++stats_refused_;
      FTRUN_LOG_WARN("refused a peer at {} (claims id {}): its hello does not prove the job secret for this "
                     "connection and this agent (id {}): a wrong secret, or a proof relayed from another connection",
                     c->remote, id, o_.self);
      return CloseConn(c, Status::FailedPrecondition("peer did not prove the job secret"));
    }
    c->peer = id;
    c->transcript = std::move(transcript);
    c->key = SessionKey(o_.secret, c->transcript);
    ByteWriter w;
    w.Put<uint32_t>(o_.self);
    w.PutString(HandshakeMac(o_.secret, "welcome", c->transcript));
    SendOnConn(c, kWelcome, w.data());
    return BecomeUp(c);
  }
  if (c->outgoing && c->state == Conn::State::kAwaitWelcome && type == kWelcome) {
    uint32_t id = r.Get<uint32_t>();
    std::string mac = r.GetString();
    if (!r.ok() || id != c->peer || !MacEqual(mac, HandshakeMac(o_.secret, "welcome", c->transcript))) {
      ++stats_refused_;
      FTRUN_LOG_WARN("refused peer {} at {}: its welcome does not prove the job secret for this connection",
                     c->peer, c->remote);
      return CloseConn(c, Status::FailedPrecondition("peer " + std::to_string(c->peer) + " at " + c->remote +
                                                     " did not prove the job secret"));
    }
    c->key = SessionKey(o_.secret, c->transcript);
    return BecomeUp(c);
  }
  ++stats_refused_;
  FTRUN_LOG_WARN("unexpected message {:#x} during the handshake with {}", type, c->remote);
  CloseConn(c, Status::Corruption("protocol error during the handshake with " + c->remote));
}

void UcxTransport::BecomeUp(Conn* c) {
  if (!c->outgoing) --handshaking_in_;
  c->state = Conn::State::kUp;
  if (c->outgoing) connecting_.erase(c->peer);
  auto& list = up_[c->peer];
  list.push_back(c);
  if (list.size() == 1) Emit({TransportEvent::Kind::kPeerUp, c->peer, 0, {}, 0, {}});
  if (!c->outgoing) {
    // A peer connects only when it has no connection with us, up or being
    // made: an older connection it made is one it gave up (its link went
    // down and it reconnected), though no error reached this side. Close
    // it, or sends (UpConn takes the oldest) would vanish into it. The new
    // one is up, so the peer is not reported down. (A connection this side
    // made stays: the two sides may have connected to each other at once.)
    std::vector<Conn*> stale;
    for (Conn* o : list) {
      if (o != c && !o->outgoing) stale.push_back(o);
    }
    for (Conn* o : stale) {
      FTRUN_LOG_DEBUG("peer {} reconnected from {}: closing its older connection from {}", c->peer, c->remote, o->remote);
      CloseConn(o, Status::Unavailable("replaced by a newer connection from the same peer"));
    }
  }
  for (auto& [type, payload] : std::exchange(c->pending, {})) SendOnConn(c, type, std::move(payload));
}

Conn* UcxTransport::UpConn(PeerId peer) {
  auto it = up_.find(peer);
  return it == up_.end() || it->second.empty() ? nullptr : it->second.front();
}

void UcxTransport::DoSend(PeerId peer, uint16_t type, std::string payload) {
  if (Conn* c = UpConn(peer)) return SendOnConn(c, type, std::move(payload));
  auto it = connecting_.find(peer);
  if (it != connecting_.end()) {
    it->second->pending.emplace_back(type, std::move(payload));
    return;
  }
  Emit({TransportEvent::Kind::kPeerDown, peer, 0, {}, 0,
        Status::Unavailable("no connection with peer " + std::to_string(peer) + ": message dropped")});
}

void UcxTransport::SendOnConn(Conn* c, uint16_t type, std::string payload) {
  auto* op = new Op{this, Op::Kind::kMessage};
  WireHeader h{};
  h.type = type;
  if (type < kChallenge) {  // after the handshake (DoSend queues what comes before): sequenced and MACed
    h.seq = c->send_seq++;
    std::string mac = MessageMac(c->key, c->sending(), h.seq, h.type, payload);
    std::memcpy(h.mac, mac.data(), kMacBytes);
  }
  op->header.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  op->payload = std::move(payload);
  op->peer = c->peer;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  p.cb.send = &UcxTransport::OnSendDone;
  p.user_data = op;
  void* r = ucp_am_send_nbx(c->ep, kAmId, op->header.data(), op->header.size(), op->payload.data(), op->payload.size(), &p);
  if (!UCS_PTR_IS_PTR(r)) delete op;  // done at once, or failed: the ep error handler reports failures
}

void UcxTransport::DoSendBulk(PeerId peer, uint64_t tag, const void* data, uint64_t length, uint64_t token) {
  Conn* c = UpConn(peer);
  if (c == nullptr) {
    Emit({TransportEvent::Kind::kBulkDone, peer, 0, {}, token,
          Status::Unavailable("no connection with peer " + std::to_string(peer))});
    return;
  }
  auto* op = new Op{this, Op::Kind::kBulkSend, token, length, peer};
  BulkHeader h{};
  h.tag = tag;
  std::string mac = BulkMac(c->key, c->sending(), tag, length);
  std::memcpy(h.mac, mac.data(), kMacBytes);
  op->header.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;  // the receiver learns which connection (hence which session) sent it
  p.cb.send = &UcxTransport::OnSendDone;
  p.user_data = op;
  void* r = ucp_am_send_nbx(c->ep, kBulkAmId, op->header.data(), op->header.size(), data, length, &p);
  if (r == nullptr) Finish(op, UCS_OK, length);
  else if (UCS_PTR_IS_ERR(r)) Finish(op, UCS_PTR_STATUS(r), 0);
  else op->request = r;
}

void UcxTransport::DoPostRecv(PeerId peer, uint64_t tag, void* data, uint64_t length, uint64_t token) {
  if (UpConn(peer) == nullptr) {
    Emit({TransportEvent::Kind::kBulkDone, peer, 0, {}, token,
          Status::Unavailable("no connection with peer " + std::to_string(peer))});
    return;
  }
  auto* op = new Op{this, Op::Kind::kBulkRecv, token, length, peer};
  op->tag = tag;
  op->data = data;
  if (!posted_.emplace(std::make_pair(peer, tag), op).second) {
    delete op;
    Emit({TransportEvent::Kind::kBulkDone, peer, 0, {}, token,
          Status::InvalidArgument("a receive from peer " + std::to_string(peer) + " under tag " + std::to_string(tag) +
                                  " is already posted")});
    return;
  }
  recvs_[token] = op;
}

// A receive not matched yet ends at once; one whose bytes are on their way
// is cancelled in UCX (its OnRecvDone follows).
void UcxTransport::CancelOp(Op* op) {
  if (op->receiving) {
    ucp_request_cancel(worker_, op->request);
    return;
  }
  posted_.erase({op->peer, op->tag});
  recvs_.erase(op->token);
  Finish(op, UCS_ERR_CANCELED, 0);
}

void UcxTransport::OnSendDone(void* request, ucs_status_t st, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  if (op->kind == Op::Kind::kMessage) {
    delete op;
  } else {
    op->owner->Finish(op, st, st == UCS_OK ? op->length : 0);
  }
  ucp_request_free(request);
}

void UcxTransport::OnRecvDone(void* request, ucs_status_t st, size_t length, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->owner->recvs_.erase(op->token);
  op->owner->Finish(op, st, st == UCS_OK ? length : 0);
  ucp_request_free(request);
}

void UcxTransport::Finish(Op* op, ucs_status_t st, uint64_t length) {
  Status s;
  if (st != UCS_OK) {
    s = UcsError(std::string(op->kind == Op::Kind::kBulkSend ? "bulk send to" : "bulk receive from") + " peer " +
                     std::to_string(op->peer),
                 st);
  } else if (length != op->length) {
    s = Status::Corruption("bulk transfer from peer " + std::to_string(op->peer) + " carried " +
                           std::to_string(length) + " bytes, " + std::to_string(op->length) + " expected");
  }
  if (s.ok()) (op->kind == Op::Kind::kBulkSend ? stats_bulk_sent_ : stats_bulk_received_) += length;
  Emit({TransportEvent::Kind::kBulkDone, op->peer, 0, {}, op->token, s});
  delete op;
}

void UcxTransport::CloseConn(Conn* c, const Status& why) {
  if (c->state == Conn::State::kClosed) return;
  bool was_up = c->state == Conn::State::kUp;
  if (!c->outgoing && !was_up) --handshaking_in_;
  c->state = Conn::State::kClosed;
  by_ep_.erase(c->ep);
  if (c->outgoing && connecting_.count(c->peer) && connecting_[c->peer] == c) connecting_.erase(c->peer);
  bool report = false;
  if (was_up) {
    auto& list = up_[c->peer];
    list.erase(std::remove(list.begin(), list.end(), c), list.end());
    report = list.empty();
    if (report) up_.erase(c->peer);
  } else {
    report = c->outgoing;  // a connect that never came up
  }
  if (report) {
    FTRUN_LOG_DEBUG("peer {} down: {}", c->peer, why.message());
    Emit({TransportEvent::Kind::kPeerDown, c->peer, 0, {}, 0, why});
    std::vector<Op*> cancel;  // cancelling may complete (and erase) at once
    for (auto& [token, op] : recvs_) {
      if (op->peer == c->peer) cancel.push_back(op);
    }
    for (Op* op : cancel) CancelOp(op);
  }
  if (c->ep) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(c->ep, &p);
    if (UCS_PTR_IS_PTR(r)) c->close_request = r;
    c->ep = nullptr;
  }
}

void UcxTransport::CloseAll(PeerId peer, const Status& why) {
  for (auto& c : conns_) {
    bool known = c->outgoing || c->state == Conn::State::kUp;  // an incoming one has no id before its hello
    if (known && c->peer == peer && c->state != Conn::State::kClosed) CloseConn(c.get(), why);
  }
}

}  // namespace

Status CreateUcxTransport(const UcxTransportOptions& options, std::unique_ptr<Transport>* out) {
  auto t = std::make_unique<UcxTransport>(options);
  FTRUN_RETURN_IF_ERROR(t->Start());
  *out = std::move(t);
  return Status::Ok();
}

}  // namespace ftrun
