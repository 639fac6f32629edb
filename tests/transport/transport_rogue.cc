// An attacker on the agents' UCX port, for the [security] transport tests
// and test_security_*.py: it speaks raw UCX (it must be able to send what a
// Transport never would), knows no secret, and reports what it saw on
// stdout, one line per event. (The one file outside plugin/transport/ that
// includes ucp.h: an attacker is not bound by the transport's rules.)
//
//   transport_rogue relay --address-file F --target ADDR --inject exit|tamper|replay
//       Listens; a Transport that connects to it is relayed, byte for byte,
//       to the real peer at ADDR (both ways). exit: once the peer welcomed
//       the relayed hello, it sends its own message of type 7 ("exit" for
//       transport_peer) with the header it saw last. tamper: the first
//       application message from the connector is forwarded, then sent again
//       with its type changed to 7. replay: that message is sent again as is.
//   transport_rogue eager --target ADDR --tags N --length L --seconds S
//       Connects (no handshake) and sends garbage under tags 1..N, eager tag
//       messages and bulk active messages, over and over for S seconds.
//       Prints "sent" after the first round.
//   transport_rogue churn --target ADDR --count N
//       Connects and closes N times, each after the peer's challenge came.
//   transport_rogue hold --target ADDR --count N --seconds S
//       Opens N connections and keeps them, silent, for S seconds.
//   transport_rogue inject --target ADDR --type T
//       Connects and sends a message of type T (say kCommit) unauthenticated.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

ucp_context_h g_context;
ucp_worker_h g_worker;
ucp_listener_h g_listener = nullptr;
ucp_ep_h g_acceptor_side = nullptr;  // relay: the endpoint to the Transport that connected to us
ucp_ep_h g_target = nullptr;         // the endpoint to the real peer
int g_challenges = 0;
int g_errors = 0;
std::string g_inject;
bool g_welcomed = false, g_injected = false;
std::string g_last_header;  // relay: the last header from the connector
std::string g_first_app_header, g_first_app_payload;

void Die(const char* what) {
  std::fprintf(stderr, "transport_rogue: %s\n", what);
  std::exit(2);
}

void Check(ucs_status_t st, const char* what) {
  if (st != UCS_OK) {
    std::fprintf(stderr, "transport_rogue: %s: %s\n", what, ucs_status_string(st));
    std::exit(2);
  }
}

void Progress(std::chrono::milliseconds for_how_long) {
  auto end = Clock::now() + for_how_long;
  while (Clock::now() < end) {
    if (ucp_worker_progress(g_worker) == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Wait(void* r) {
  if (!UCS_PTR_IS_PTR(r)) return;
  auto end = Clock::now() + std::chrono::seconds(5);
  while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < end) ucp_worker_progress(g_worker);
  if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(g_worker, r);
  ucp_request_free(r);
}

void OnEpError(void*, ucp_ep_h, ucs_status_t) { ++g_errors; }

ucp_ep_h ConnectTo(const std::string& address) {
  auto colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) Die("bad address");
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep.sockaddr.addrlen = sizeof(sa);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &OnEpError;
  ucp_ep_h h = nullptr;
  Check(ucp_ep_create(g_worker, &ep, &h), "ucp_ep_create");
  return h;
}

void Close(ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  Wait(ucp_ep_close_nbx(ep, &p));
}

// Fire and forget: the buffers live in `keep` until the process ends (a
// deque: its elements never move).
std::deque<std::string> g_keep;
void SendAm(ucp_ep_h ep, unsigned id, const std::string& header, const std::string& payload) {
  g_keep.push_back(header);
  const std::string& h = g_keep.back();
  g_keep.push_back(payload);
  const std::string& d = g_keep.back();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  void* r = ucp_am_send_nbx(ep, id, h.data(), h.size(), d.data(), d.size(), &p);
  if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
}

uint32_t TypeOf(const std::string& header) {
  uint32_t t = 0;
  if (header.size() >= 4) std::memcpy(&t, header.data(), 4);
  return t;
}

std::string WithType(std::string header, uint32_t type) {
  if (header.size() >= 4) std::memcpy(header.data(), &type, 4);
  return header;
}

ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                  const ucp_am_recv_param_t* param) {
  unsigned id = static_cast<unsigned>(reinterpret_cast<uintptr_t>(arg));
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_ERR_UNSUPPORTED;
  std::string h(static_cast<const char*>(header), header_length), d(static_cast<const char*>(data), length);
  if (TypeOf(h) == 0xFF01) ++g_challenges;
  if (g_acceptor_side == nullptr || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
  if (param->reply_ep == g_target) {  // peer -> connector
    if (id == 1 && TypeOf(h) == 0xFF03) {
      g_welcomed = true;
      std::printf("welcomed\n");
    }
    SendAm(g_acceptor_side, id, h, d);
  } else {  // connector -> peer
    if (id == 1) g_last_header = h;
    SendAm(g_target, id, h, d);
    if (id == 1 && TypeOf(h) < 0xFF01 && g_first_app_header.empty()) {
      g_first_app_header = h;
      g_first_app_payload = d;
    }
  }
  std::fflush(stdout);
  return UCS_OK;
}

void OnConnRequest(ucp_conn_request_h req, void*) {
  if (g_acceptor_side != nullptr) {
    ucp_listener_reject(g_listener, req);
    return;
  }
  ucp_ep_params_t ep{};
  ep.field_mask =
      UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &OnEpError;
  Check(ucp_ep_create(g_worker, &ep, &g_acceptor_side), "accept");
}

std::string Arg(int argc, char** argv, const std::string& key, const std::string& fallback = "") {
  for (int i = 2; i + 1 < argc; ++i) {
    if (argv[i] == key) return argv[i + 1];
  }
  return fallback;
}

// A 48-byte control header (this tree's wire format) and the old 4-byte one
// are both tried by `inject`, so it means the same on either.
std::string Header(uint32_t type, size_t size) {
  std::string h(size, '\0');
  std::memcpy(h.data(), &type, 4);
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Die("usage: transport_rogue relay|eager|churn|hold|inject ...");
  std::string mode = argv[1];
  ucp_config_t* config = nullptr;
  Check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_TAG;
  Check(ucp_init(&params, config, &g_context), "ucp_init");
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  Check(ucp_worker_create(g_context, &wp, &g_worker), "ucp_worker_create");
  for (unsigned id : {1u, 2u}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = &OnAm;
    hp.arg = reinterpret_cast<void*>(static_cast<uintptr_t>(id));
    Check(ucp_worker_set_am_recv_handler(g_worker, &hp), "ucp_worker_set_am_recv_handler");
  }
  const std::string target = Arg(argc, argv, "--target");
  if (target.empty()) Die("--target is required");

  if (mode == "relay") {
    g_inject = Arg(argc, argv, "--inject", "exit");
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    lp.sockaddr.addrlen = sizeof(sa);
    lp.conn_handler.cb = &OnConnRequest;
    Check(ucp_listener_create(g_worker, &lp, &g_listener), "ucp_listener_create");
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    Check(ucp_listener_query(g_listener, &la), "ucp_listener_query");
    const auto* in = reinterpret_cast<const sockaddr_in*>(&la.sockaddr);
    std::string file = Arg(argc, argv, "--address-file");
    std::ofstream(file + ".tmp") << "127.0.0.1:" << ntohs(in->sin_port) << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
    while (g_acceptor_side == nullptr) Progress(std::chrono::milliseconds(10));
    g_target = ConnectTo(target);
    auto end = Clock::now() + std::chrono::seconds(std::stoi(Arg(argc, argv, "--seconds", "20")));
    while (Clock::now() < end) {
      Progress(std::chrono::milliseconds(10));
      if (g_errors) {  // one side closed: close the other, as a relay would
        std::printf("closed\n");
        std::fflush(stdout);
        Close(g_target);
        Close(g_acceptor_side);
        Progress(std::chrono::milliseconds(500));
        return 0;
      }
      if (g_injected) continue;
      if (g_inject == "exit" && g_welcomed) {
        SendAm(g_target, 1, WithType(g_last_header, 7), "");
        g_injected = true;
      } else if (g_inject == "tamper" && !g_first_app_header.empty()) {
        SendAm(g_target, 1, WithType(g_first_app_header, 7), g_first_app_payload);
        g_injected = true;
      } else if (g_inject == "replay" && !g_first_app_header.empty()) {
        SendAm(g_target, 1, g_first_app_header, g_first_app_payload);
        g_injected = true;
      }
      if (g_injected) {
        std::printf("injected\n");
        std::fflush(stdout);
      }
    }
    return 0;
  }

  if (mode == "eager") {
    const uint64_t tags = std::stoull(Arg(argc, argv, "--tags", "1000"));
    const size_t length = std::stoull(Arg(argc, argv, "--length", "4096"));
    const int seconds = std::stoi(Arg(argc, argv, "--seconds", "10"));
    std::string garbage(length, 'X');
    ucp_ep_h ep = ConnectTo(target);
    Progress(std::chrono::milliseconds(200));
    auto end = Clock::now() + std::chrono::seconds(seconds);
    bool first = true;
    std::vector<void*> pending;
    while (Clock::now() < end) {
      for (uint64_t tag = 1; tag <= tags; ++tag) {
        ucp_request_param_t p{};
        void* r = ucp_tag_send_nbx(ep, garbage.data(), garbage.size(), tag, &p);
        if (UCS_PTR_IS_PTR(r)) pending.push_back(r);
        // The same as a bulk active message, with a header of the right size.
        std::string h(40, '\0');
        std::memcpy(h.data(), &tag, 8);
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_AM_SEND_FLAG_REPLY;
        r = ucp_am_send_nbx(ep, 2, h.data(), h.size(), garbage.data(), garbage.size(), &p);
        if (UCS_PTR_IS_PTR(r)) pending.push_back(r);
        if (tag % 64 == 0) ucp_worker_progress(g_worker);
      }
      // Requests a rendezvous peer never fetches stay pending: let go of
      // their handles (the bytes are this process's own, alive to the end).
      for (void* r : pending) {
        if (ucp_request_check_status(r) != UCS_INPROGRESS) ucp_request_free(r);
      }
      pending.clear();
      Progress(std::chrono::milliseconds(50));
      if (first) {
        std::printf("sent\n");
        std::fflush(stdout);
        first = false;
      }
      if (g_errors) {  // the peer closed us: connect again and go on
        g_errors = 0;
        ep = ConnectTo(target);
        Progress(std::chrono::milliseconds(100));
      }
    }
    return 0;
  }

  if (mode == "churn") {
    const int count = std::stoi(Arg(argc, argv, "--count", "1000"));
    for (int i = 0; i < count; ++i) {
      int before = g_challenges;
      ucp_ep_h ep = ConnectTo(target);
      auto end = Clock::now() + std::chrono::seconds(5);
      while (g_challenges == before && Clock::now() < end) {
        if (ucp_worker_progress(g_worker) == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      Close(ep);
    }
    Progress(std::chrono::milliseconds(200));
    std::printf("challenges %d of %d\n", g_challenges, count);
    ucp_worker_destroy(g_worker);  // every endpoint is closed: a clean exit (checked under ASan)
    ucp_cleanup(g_context);
    return 0;
  }

  if (mode == "hold") {
    const int count = std::stoi(Arg(argc, argv, "--count", "200"));
    std::vector<ucp_ep_h> eps;
    for (int i = 0; i < count; ++i) {
      eps.push_back(ConnectTo(target));
      Progress(std::chrono::milliseconds(2));
    }
    Progress(std::chrono::milliseconds(500));
    std::printf("holding %d\n", count);
    std::fflush(stdout);
    Progress(std::chrono::seconds(std::stoi(Arg(argc, argv, "--seconds", "5"))));
    return 0;
  }

  if (mode == "inject") {
    const uint32_t type = static_cast<uint32_t>(std::stoul(Arg(argc, argv, "--type", "7")));
    for (size_t size : {size_t{4}, size_t{48}}) {
      ucp_ep_h ep = ConnectTo(target);
      Progress(std::chrono::milliseconds(200));
      SendAm(ep, 1, Header(type, size), std::string(64, '\0'));
      Progress(std::chrono::milliseconds(200));
      Close(ep);
    }
    std::printf("injected\n");
    ucp_worker_destroy(g_worker);
    ucp_cleanup(g_context);
    return 0;
  }
  Die("unknown mode");
}
