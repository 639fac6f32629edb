// An agent of the job that the job no longer counts on: it holds the job
// secret (so its connection authenticates) but no membership names it, like
// a fenced agent that lives on. It asks one agent for one thing and prints
// the answer, for test_security_roles.py:
//
//   transport_impostor --secret-file F --target ADDRESS --target-id N
//                      --id M --epoch E --rank R --version V --ask offer|pull
//
//   offer: a routine copy of (R, V) into the target's store (one chunk);
//          the target answers "want" (it would store it) or "offer-failed".
//   pull:  a pull of (R, V) from the target; it answers "offer" (it would
//          send the shard) or "offer-failed".
// Prints "answer <name>: <message>" and exits 0, or exits 1 with no answer
// within 20 s.
#include <poll.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "plugin/common/bytes.h"
#include "plugin/common/hash.h"
#include "plugin/common/log.h"
#include "plugin/protocol/cluster_messages.h"
#include "plugin/store/manifest.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"

using namespace ftrun;

namespace {

std::string Arg(int argc, char** argv, const std::string& key) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (argv[i] == key) return argv[i + 1];
  }
  std::fprintf(stderr, "transport_impostor: %s is required\n", key.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  UcxTransportOptions o;
  o.self = static_cast<PeerId>(std::stoul(Arg(argc, argv, "--id")));
  const PeerId target = static_cast<PeerId>(std::stoul(Arg(argc, argv, "--target-id")));
  const uint64_t epoch = std::stoull(Arg(argc, argv, "--epoch"));
  const int32_t rank = std::stoi(Arg(argc, argv, "--rank"));
  const uint64_t version = std::stoull(Arg(argc, argv, "--version"));
  const std::string ask = Arg(argc, argv, "--ask");
  InitLogging("transport_impostor", static_cast<int>(o.self), -1, "info");
  Status s = ReadSecretFile(Arg(argc, argv, "--secret-file"), &o.secret);
  std::unique_ptr<Transport> t;
  if (s.ok()) s = CreateUcxTransport(o, &t);
  if (!s.ok()) {
    std::fprintf(stderr, "transport_impostor: %s\n", s.ToString().c_str());
    return 2;
  }
  t->Connect(target, Arg(argc, argv, "--target"));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (bool up = false; !up;) {
    if (std::chrono::steady_clock::now() > end) {
      std::printf("no connection within 20 s\n");
      return 1;
    }
    pollfd pfd{t->event_fd(), POLLIN, 0};
    ::poll(&pfd, 1, 100);
    for (TransportEvent& e : t->Poll()) {
      if (e.kind == TransportEvent::Kind::kPeerDown) {
        std::printf("connection refused: %s\n", e.status.message().c_str());
        return 1;
      }
      up |= e.kind == TransportEvent::Kind::kPeerUp && e.peer == target;
    }
  }
  ByteWriter w;
  if (ask == "offer") {
    Manifest m;
    m.rank = rank;
    m.version = version;
    TensorManifest tm;
    const std::string bytes(4096, 'z');
    tm.chunks.push_back({HashBytes(bytes.data(), bytes.size()), bytes.size(), kNoOffset});
    tm.info = {"w", DType::kUInt8, {4096}, 4096, Device::kHost};
    m.tensors.push_back(tm);
    w.Put<uint64_t>(1);  // a routine copy's transfer id
    w.Put<uint64_t>(epoch);
    EncodeManifest(m, &w);
    t->Send(target, static_cast<uint16_t>(ClusterMsg::kOffer), w.data());
  } else {
    w.Put<uint64_t>((1ull << 62) | 1);  // a pull's transfer id
    w.Put<uint64_t>(epoch);
    w.Put<int32_t>(rank);
    w.Put<uint64_t>(version);
    t->Send(target, static_cast<uint16_t>(ClusterMsg::kPullRequest), w.data());
  }
  while (std::chrono::steady_clock::now() < end) {
    pollfd pfd{t->event_fd(), POLLIN, 0};
    ::poll(&pfd, 1, 100);
    for (TransportEvent& e : t->Poll()) {
      if (e.kind == TransportEvent::Kind::kPeerDown) {
        std::printf("answer down: %s\n", e.status.message().c_str());
        return 0;
      }
      if (e.kind != TransportEvent::Kind::kMessage || e.peer != target) continue;
      ByteReader r(e.payload);
      r.Get<uint64_t>();  // the transfer id
      std::string message;
      if (e.type == static_cast<uint16_t>(ClusterMsg::kOfferFailed)) message = r.GetString();
      std::printf("answer %s: %s\n", ClusterMsgName(e.type).c_str(), message.c_str());
      return 0;
    }
  }
  std::printf("no answer within 20 s\n");
  return 1;
}
