#include "plugin/transport/ucx_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "plugin/transport/ucx_transport_impl.h"

namespace ftrun {
namespace ucx {

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

UcxTransport::~UcxTransport() {
  stop_ = true;
  commands_.Wake();
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
  // Serialized, not single: this thread creates the worker, the progress
  // thread then uses it alone. UCX 1.18 (Debian 13) asserts in single mode
  // that every call comes from the thread that created the worker.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
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
  FTRUN_RETURN_IF_ERROR(events_.Open("transport events"));
  FTRUN_RETURN_IF_ERROR(commands_.Open("transport commands"));
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return Status::FromErrno("epoll_create1", errno);
  for (int fd : {efd, commands_.fd()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl", errno);
  }
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void UcxTransport::Post(std::function<void()> fn) { commands_.Push(std::move(fn)); }

void UcxTransport::Emit(TransportEvent e) { events_.Push(std::move(e)); }

std::vector<TransportEvent> UcxTransport::Poll() { return events_.Take(); }

void UcxTransport::Run() {
  epoll_event evs[4];
  Clock::time_point last_busy{};
  while (!stop_) {
    // Bounded: under a stream of bulk traffic progress never runs dry, and
    // queued commands (a heartbeat) must not starve behind it.
    int progressed = 0;
    while (progressed < 64 && ucp_worker_progress(worker_) != 0) ++progressed;
    const auto now = Clock::now();
    if (progressed > 0 && (bulk_active_ > 0 || now - last_bulk_done_ < kSpinAfterBusy)) last_busy = now;
    for (auto& [c, why] : std::exchange(failed_, {})) CloseConn(c, why);
    DrainTags();
    Reap();
    RunCommands();
    CheckDeadlines();
    // While bulk bytes are moving, poll instead of sleeping: arming the
    // worker and waking from epoll per completion costs more than the wait
    // it saves. Sleep once nothing has happened for kSpinAfterBusy.
    if (Clock::now() - last_busy < kSpinAfterBusy) {
      ::sched_yield();  // a thread with work (the agent hashing what landed) goes first
      continue;
    }
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    int n = ::epoll_wait(epoll_.get(), evs, 4, 100);
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == commands_.fd()) commands_.ClearWake();  // (RunCommands takes them, every pass)
    }
  }
}

void UcxTransport::RunCommands() {
  for (auto& fn : commands_.TakeQueued()) fn();
}

}  // namespace ucx

Status CreateUcxTransport(const UcxTransportOptions& options, std::unique_ptr<Transport>* out) {
  auto t = std::make_unique<ucx::UcxTransport>(options);
  FTRUN_RETURN_IF_ERROR(t->Start());
  *out = std::move(t);
  return Status::Ok();
}

}  // namespace ftrun
