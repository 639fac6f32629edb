// A Transport peer in its own process, for the contract tests: it listens,
// writes its address to a file, and serves the test's requests. A real
// process so a test can SIGKILL it mid-transfer.
//
//   transport_peer --id N --secret-file F --address-file F [--listen IP]
//
// Messages it understands (type: payload -> reply):
//   1 ping: bytes           -> 2 pong: same bytes
//   3 expect: tag, length   -> posts a receive, replies 8; when the
//                              receive ends 4: status code, xxh64 of it
//   5 fetch: tag, length, seed -> bulk send of Pattern(seed) under tag;
//                              when done 6: status code
//   7 exit                  -> exits 0
#include <poll.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "plugin/common/bytes.h"
#include "plugin/common/log.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"
#include "tests/transport/pattern.h"

using namespace ftrun;

int main(int argc, char** argv) {
  UcxTransportOptions o;
  std::string secret_file, address_file;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--id")
      o.self = static_cast<PeerId>(std::stoul(v));
    else if (k == "--secret-file")
      secret_file = v;
    else if (k == "--address-file")
      address_file = v;
    else if (k == "--listen")
      o.listen_ip = v;
  }
  InitLogging("transport_peer", static_cast<int>(o.self), -1, "info");  // to stderr, flushed per warning
  Status s = ReadSecretFile(secret_file, &o.secret);
  std::unique_ptr<Transport> t;
  if (s.ok()) s = CreateUcxTransport(o, &t);
  if (!s.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", s.ToString().c_str());
    return 2;
  }
  {
    std::ofstream(address_file + ".tmp") << t->address() << "\n";
    std::rename((address_file + ".tmp").c_str(), address_file.c_str());
  }
  struct Buf {
    PeerId from;
    std::vector<char> bytes;
  };
  std::unordered_map<uint64_t, Buf> bufs;  // token -> buffer
  uint64_t next_token = 1;
  while (true) {
    pollfd pfd{t->event_fd(), POLLIN, 0};
    ::poll(&pfd, 1, 1000);
    for (TransportEvent& e : t->Poll()) {
      if (e.kind == TransportEvent::Kind::kBulkDone) {
        auto it = bufs.find(e.token);
        if (it == bufs.end()) continue;
        ByteWriter w;
        w.Put<uint32_t>(static_cast<uint32_t>(e.status.code()));
        bool recv = e.token & 1;
        if (recv) w.Put<uint64_t>(XXH64(it->second.bytes.data(), it->second.bytes.size(), 0));
        t->Send(it->second.from, recv ? 4 : 6, w.data());
        bufs.erase(it);
        continue;
      }
      if (e.kind != TransportEvent::Kind::kMessage) continue;
      ByteReader r(e.payload);
      if (e.type == 1) {
        t->Send(e.peer, 2, e.payload);
      } else if (e.type == 3) {
        uint64_t tag = r.Get<uint64_t>(), len = r.Get<uint64_t>();
        uint64_t token = (next_token++ << 1) | 1;  // odd: receives
        Buf& b = bufs[token];
        b.from = e.peer;
        b.bytes.resize(len);
        t->PostRecv(e.peer, tag, b.bytes.data(), len, token);
        t->Send(e.peer, 8, "");  // "posted"
      } else if (e.type == 5) {
        uint64_t tag = r.Get<uint64_t>(), len = r.Get<uint64_t>(), seed = r.Get<uint64_t>();
        uint64_t token = next_token++ << 1;  // even: sends
        Buf& b = bufs[token];
        b.from = e.peer;
        b.bytes = Pattern(seed, len);
        t->SendBulk(e.peer, tag, b.bytes.data(), len, token);
      } else if (e.type == 7) {
        return 0;
      }
    }
  }
}
