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
constexpr unsigned kAmId = 1;
// Handshake message types, above every application type.
constexpr uint16_t kChallenge = 0xFF01;  // acceptor -> connector: nonce
constexpr uint16_t kHello = 0xFF02;      // connector -> acceptor: id, nonce, mac
constexpr uint16_t kWelcome = 0xFF03;    // acceptor -> connector: id, mac

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
  std::string remote;  // for logs
  Clock::time_point started;
  std::vector<std::pair<uint16_t, std::string>> pending;  // sent before up
};

// One in-flight operation; user_data of its request.
struct Op {
  enum class Kind { kMessage, kBulkSend, kBulkRecv, kClose };
  UcxTransport* owner;
  Kind kind;
  uint64_t token = 0;
  uint64_t length = 0;
  PeerId peer = 0;
  uint32_t header = 0;  // message type, kept alive until completion
  std::string payload;
  void* request = nullptr;
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
      if (it != recvs_.end()) ucp_request_cancel(worker_, it->second->request);
    });
  }
  int event_fd() const override { return event_fd_.get(); }
  std::vector<TransportEvent> Poll() override;
  TransportStats stats() const override {
    TransportStats s;
    s.bulk_bytes_sent = stats_bulk_sent_;
    s.bulk_bytes_received = stats_bulk_received_;
    s.message_bytes_sent = stats_message_bytes_;
    return s;
  }

  // UCX callbacks (progress thread).
  static void OnConnRequest(ucp_conn_request_h req, void* arg);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t st);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param);
  static void OnSendDone(void* request, ucs_status_t st, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t st, const ucp_tag_recv_info_t* info, void* user_data);

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
  void BecomeUp(Conn* c);
  void CloseConn(Conn* c, const Status& why);
  void CloseAll(PeerId peer, const Status& why);
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

  std::mutex mu_;  // guards commands_ and events_
  std::vector<std::function<void()>> commands_;
  std::vector<TransportEvent> events_;

  // Progress thread only.
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  std::list<std::unique_ptr<Conn>> conns_;  // closed ones stay until the end (late callbacks)
  std::unordered_map<ucp_ep_h, Conn*> by_ep_;
  std::map<PeerId, Conn*> connecting_;
  std::map<PeerId, std::vector<Conn*>> up_;
  std::map<uint64_t, Op*> recvs_;  // token -> posted receive
  std::vector<std::pair<Conn*, Status>> failed_;  // ep errors, handled after progress
  std::list<Op*> closing_;
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
      if (c->state == Conn::State::kClosed || c->ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(c->ep, &p);
      if (UCS_PTR_IS_PTR(r)) {
        auto deadline = Clock::now() + std::chrono::seconds(1);
        while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) ucp_worker_progress(worker_);
        ucp_request_free(r);
      }
    }
    std::vector<void*> cancel;
    for (auto& [token, op] : recvs_) cancel.push_back(op->request);
    for (void* r : cancel) ucp_request_cancel(worker_, r);
    for (int i = 0; i < 100; ++i) ucp_worker_progress(worker_);
    ucp_worker_destroy(worker_);
  }
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
    for (auto it = closing_.begin(); it != closing_.end();) {
      Op* op = *it;
      if (ucp_request_check_status(op->request) == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(op->request);
      delete op;
      it = closing_.erase(it);
    }
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
  Conn* raw = c.get();
  conns_.push_back(std::move(c));
  return raw;
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
    c->state = Conn::State::kClosed;
    FTRUN_LOG_WARN("cannot accept a connection from {}: {}", remote, ucs_status_string(st));
    return;
  }
  self->by_ep_[c->ep] = c;
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
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || header_length != sizeof(uint32_t) ||
      (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_UNSUPPORTED : UCS_OK;  // not ours
  }
  auto it = self->by_ep_.find(param->reply_ep);
  if (it == self->by_ep_.end() || it->second->state == Conn::State::kClosed) return UCS_OK;
  Conn* c = it->second;
  uint32_t type;
  std::memcpy(&type, header, sizeof(type));
  std::string payload(static_cast<const char*>(data), length);
  if (c->state != Conn::State::kUp) {
    self->Handshake(c, static_cast<uint16_t>(type), payload);
  } else if (type < kChallenge) {
    self->Emit({TransportEvent::Kind::kMessage, c->peer, static_cast<uint16_t>(type), std::move(payload), 0, {}});
  }
  return UCS_OK;
}

void UcxTransport::Handshake(Conn* c, uint16_t type, const std::string& payload) {
  ByteReader r(payload);
  if (c->outgoing && c->state == Conn::State::kAwaitChallenge && type == kChallenge &&
      payload.size() == kNonceBytes) {
    c->nonce = NewNonce();
    ByteWriter w;
    w.Put<uint32_t>(o_.self);
    w.PutString(c->nonce);
    w.PutString(HandshakeMac(o_.secret, "hello", payload, o_.self));
    SendOnConn(c, kHello, w.data());
    c->state = Conn::State::kAwaitWelcome;
    return;
  }
  if (!c->outgoing && c->state == Conn::State::kAwaitHello && type == kHello) {
    uint32_t id = r.Get<uint32_t>();
    std::string their_nonce = r.GetString();
    std::string mac = r.GetString();
    if (!r.ok() || their_nonce.size() != kNonceBytes || !MacEqual(mac, HandshakeMac(o_.secret, "hello", c->nonce, id))) {
      FTRUN_LOG_WARN("refused a peer at {} (claims id {}): it did not prove the job secret", c->remote, id);
      return CloseConn(c, Status::FailedPrecondition("peer did not prove the job secret"));
    }
    c->peer = id;
    ByteWriter w;
    w.Put<uint32_t>(o_.self);
    w.PutString(HandshakeMac(o_.secret, "welcome", their_nonce, o_.self));
    SendOnConn(c, kWelcome, w.data());
    return BecomeUp(c);
  }
  if (c->outgoing && c->state == Conn::State::kAwaitWelcome && type == kWelcome) {
    uint32_t id = r.Get<uint32_t>();
    std::string mac = r.GetString();
    if (!r.ok() || id != c->peer || !MacEqual(mac, HandshakeMac(o_.secret, "welcome", c->nonce, id))) {
      FTRUN_LOG_WARN("refused peer {} at {}: it did not prove the job secret", c->peer, c->remote);
      return CloseConn(c, Status::FailedPrecondition("peer " + std::to_string(c->peer) + " at " + c->remote +
                                                     " did not prove the job secret"));
    }
    return BecomeUp(c);
  }
  FTRUN_LOG_WARN("unexpected message {:#x} during the handshake with {}", type, c->remote);
  CloseConn(c, Status::Corruption("protocol error during the handshake with " + c->remote));
}

void UcxTransport::BecomeUp(Conn* c) {
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
  op->header = type;
  op->payload = std::move(payload);
  op->peer = c->peer;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  p.cb.send = &UcxTransport::OnSendDone;
  p.user_data = op;
  void* r = ucp_am_send_nbx(c->ep, kAmId, &op->header, sizeof(op->header), op->payload.data(), op->payload.size(), &p);
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
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxTransport::OnSendDone;
  p.user_data = op;
  void* r = ucp_tag_send_nbx(c->ep, data, length, tag, &p);
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
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv = &UcxTransport::OnRecvDone;
  p.user_data = op;
  void* r = ucp_tag_recv_nbx(worker_, data, length, tag, ~0ull, &p);
  if (UCS_PTR_IS_ERR(r)) return Finish(op, UCS_PTR_STATUS(r), 0);
  op->request = r;
  recvs_[token] = op;
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

void UcxTransport::OnRecvDone(void* request, ucs_status_t st, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->owner->recvs_.erase(op->token);
  op->owner->Finish(op, st, st == UCS_OK ? info->length : 0);
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
    std::vector<void*> cancel;  // cancelling may complete (and erase) at once
    for (auto& [token, op] : recvs_) {
      if (op->peer == c->peer) cancel.push_back(op->request);
    }
    for (void* r : cancel) ucp_request_cancel(worker_, r);
  }
  if (c->ep) {
    auto* op = new Op{this, Op::Kind::kClose};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(c->ep, &p);
    if (UCS_PTR_IS_PTR(r)) {
      op->request = r;
      closing_.push_back(op);
    } else {
      delete op;
    }
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
