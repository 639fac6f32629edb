// Contract tests for Transport, run against the UCX implementation with
// peers in real processes (transport_peer): handshake and secret, messages,
// bulk both ways, refused connections, and a peer SIGKILLed mid-transfer.
// Deadlines here bound a hang; they are not performance assertions.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include "plugin/common/bytes.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"
#include "tests/catch.h"
#include "tests/transport/pattern.h"

extern char** environ;

namespace ftrun {
namespace {

using Clock = std::chrono::steady_clock;
using Kind = TransportEvent::Kind;

std::string TempDir() {
  char tmpl[] = "/tmp/ftrun-transport-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

std::string SecretIn(const std::string& dir, const std::string& name) {
  std::string path = dir + "/" + name;
  REQUIRE(WriteNewSecretFile(path).ok());
  return path;
}

// Spawns `args` (argv[0] a path), with stderr or stdout sent to a file if named.
pid_t Spawn(std::vector<std::string> args, const std::string& stdout_file = "", const std::string& stderr_file = "") {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  if (!stdout_file.empty())
    ::posix_spawn_file_actions_addopen(&fa, 1, stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (!stderr_file.empty())
    ::posix_spawn_file_actions_addopen(&fa, 2, stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, args[0].c_str(), &fa, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return pid;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Waits up to `seconds` for `text` to appear in the file at `path`.
bool FileHas(const std::string& path, const std::string& text, int seconds = 20) {
  auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < deadline) {
    if (ReadFile(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class Peer {
 public:
  // `log`: where its stderr (the transport's log) goes; empty: inherited.
  Peer(const std::string& dir, PeerId id, const std::string& secret_file, const std::string& log = "") {
    std::string addr_file = dir + "/peer" + std::to_string(id) + ".addr";
    std::string exe = std::string(FTRUN_BINARY_DIR) + "/tests/transport_peer";
    pid_ = Spawn({exe, "--id", std::to_string(id), "--secret-file", secret_file, "--address-file", addr_file}, "", log);
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      std::ifstream f(addr_file);
      if (f >> address_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL("transport_peer did not start within 20 s");
  }
  ~Peer() { Kill(); }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = 0;
  std::string address_;
};

std::unique_ptr<Transport> Make(PeerId self, const std::string& secret_file) {
  UcxTransportOptions o;
  o.self = self;
  REQUIRE(ReadSecretFile(secret_file, &o.secret).ok());
  o.handshake_timeout = std::chrono::milliseconds(3000);
  std::unique_ptr<Transport> t;
  Status s = CreateUcxTransport(o, &t);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return t;
}

// Waits up to `seconds` for an event matching `want`; other events are kept.
TransportEvent WaitFor(Transport& t, std::vector<TransportEvent>& seen,
                       const std::function<bool(const TransportEvent&)>& want, int seconds = 20) {
  auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (true) {
    for (auto it = seen.begin(); it != seen.end(); ++it) {
      if (want(*it)) {
        TransportEvent e = std::move(*it);
        seen.erase(it);
        return e;
      }
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) FAIL("no expected transport event within " << seconds << " s");
    pollfd p{t.event_fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<long>(left, 100)));
    for (auto& e : t.Poll()) seen.push_back(std::move(e));
  }
}

auto IsKind(Kind k, PeerId peer) {
  return [=](const TransportEvent& e) { return e.kind == k && e.peer == peer; };
}
auto IsMsg(PeerId peer, uint16_t type) {
  return [=](const TransportEvent& e) { return e.kind == Kind::kMessage && e.peer == peer && e.type == type; };
}

std::string U64s(std::initializer_list<uint64_t> v) {
  ByteWriter w;
  for (uint64_t x : v) w.Put<uint64_t>(x);
  return w.data();
}

TEST_CASE("transport: peers that share the secret connect and exchange messages in order") {
  std::string dir = TempDir();
  std::string secret = SecretIn(dir, "secret");
  Peer peer(dir, 7, secret);
  auto t = Make(1, secret);
  std::vector<TransportEvent> seen;
  t->Connect(7, peer.address());
  for (int i = 0; i < 50; ++i) t->Send(7, 1, "ping " + std::to_string(i));  // queued before the handshake ends
  WaitFor(*t, seen, IsKind(Kind::kPeerUp, 7));
  for (int i = 0; i < 50; ++i) {
    TransportEvent e = WaitFor(*t, seen, IsMsg(7, 2));
    REQUIRE(e.payload == "ping " + std::to_string(i));
  }
  std::string big(3 << 20, 'x');  // a message larger than any eager fragment
  t->Send(7, 1, big);
  REQUIRE(WaitFor(*t, seen, IsMsg(7, 2)).payload == big);
}

TEST_CASE("transport: a peer without the job secret is refused, both ways") {
  std::string dir = TempDir();
  std::string good = SecretIn(dir, "good"), other = SecretIn(dir, "other");
  Peer peer(dir, 7, other);
  auto t = Make(1, good);
  std::vector<TransportEvent> seen;
  t->Connect(7, peer.address());
  t->Send(7, 1, "must not arrive");
  TransportEvent e = WaitFor(*t, seen, IsKind(Kind::kPeerDown, 7));
  INFO(e.status.ToString());
  REQUIRE(!e.status.ok());
  for (const auto& x : seen) REQUIRE(x.kind != Kind::kMessage);
  REQUIRE(t->stats().bulk_bytes_received == 0);
}

TEST_CASE("transport: connecting to an address where nobody listens reports the peer down") {
  std::string dir = TempDir();
  std::string secret = SecretIn(dir, "secret");
  auto t = Make(1, secret);
  std::vector<TransportEvent> seen;
  t->Connect(9, "127.0.0.1:1");
  REQUIRE(!WaitFor(*t, seen, IsKind(Kind::kPeerDown, 9)).status.ok());
  t->Connect(10, "not-an-address");
  TransportEvent e = WaitFor(*t, seen, IsKind(Kind::kPeerDown, 10));
  REQUIRE(e.status.message().find("IPv4:PORT") != std::string::npos);
}

TEST_CASE("transport: bulk bytes arrive intact in both directions") {
  std::string dir = TempDir();
  std::string secret = SecretIn(dir, "secret");
  Peer peer(dir, 7, secret);
  auto t = Make(1, secret);
  std::vector<TransportEvent> seen;
  t->Connect(7, peer.address());
  WaitFor(*t, seen, IsKind(Kind::kPeerUp, 7));
  for (uint64_t len : {uint64_t{1}, uint64_t{4096}, uint64_t{4} << 20, uint64_t{64} << 20}) {
    // To the peer: it posts first, then we send.
    std::vector<char> data = Pattern(len, len);
    t->Send(7, 3, U64s({len + 100, len}));
    WaitFor(*t, seen, IsMsg(7, 8));
    t->SendBulk(7, len + 100, data.data(), len, 1000 + len);
    TransportEvent done =
        WaitFor(*t, seen, [&](const TransportEvent& e) { return e.kind == Kind::kBulkDone && e.token == 1000 + len; });
    REQUIRE(done.status.ok());
    std::string reply = WaitFor(*t, seen, IsMsg(7, 4)).payload;
    ByteReader r(reply);
    REQUIRE(r.Get<uint32_t>() == 0);
    REQUIRE(r.Get<uint64_t>() == XXH64(data.data(), len, 0));
    // From the peer: we post, then ask.
    std::vector<char> in(len);
    t->PostRecv(7, len + 200, in.data(), len, 2000 + len);
    t->Send(7, 5, U64s({len + 200, len, 42}));
    done =
        WaitFor(*t, seen, [&](const TransportEvent& e) { return e.kind == Kind::kBulkDone && e.token == 2000 + len; });
    REQUIRE(done.status.ok());
    REQUIRE(in == Pattern(42, len));
  }
}

TEST_CASE("transport: a peer SIGKILLed mid-transfer is reported and the others keep working") {
  std::string dir = TempDir();
  std::string secret = SecretIn(dir, "secret");
  Peer victim(dir, 7, secret), other(dir, 8, secret);
  auto t = Make(1, secret);
  std::vector<TransportEvent> seen;
  t->Connect(7, victim.address());
  t->Connect(8, other.address());
  WaitFor(*t, seen, IsKind(Kind::kPeerUp, 7));
  WaitFor(*t, seen, IsKind(Kind::kPeerUp, 8));
  // A transfer in each direction with the victim, then kill it.
  const uint64_t len = 512ull << 20;
  std::vector<char> out(len, 'a'), in(len);
  t->Send(7, 3, U64s({11, len}));
  WaitFor(*t, seen, IsMsg(7, 8));
  t->SendBulk(7, 11, out.data(), len, 1);
  t->PostRecv(7, 12, in.data(), len, 2);
  victim.Kill();
  auto start = Clock::now();
  TransportEvent down = WaitFor(*t, seen, IsKind(Kind::kPeerDown, 7), 30);
  REQUIRE(!down.status.ok());
  for (uint64_t token : {1, 2}) {
    TransportEvent e = WaitFor(
        *t, seen, [&](const TransportEvent& x) { return x.kind == Kind::kBulkDone && x.token == token; }, 30);
    if (token == 2) REQUIRE(!e.status.ok());  // the receive can never complete
  }
  INFO("failure reported after " << std::chrono::duration<double>(Clock::now() - start).count() << " s");
  // The survivor still talks to the other peer, bulk included.
  t->Send(8, 1, "still there?");
  REQUIRE(WaitFor(*t, seen, IsMsg(8, 2)).payload == "still there?");
  std::vector<char> in2(1 << 20);
  t->PostRecv(8, 13, in2.data(), in2.size(), 3);
  t->Send(8, 5, U64s({13, in2.size(), 5}));
  REQUIRE(
      WaitFor(*t, seen, [](const TransportEvent& x) { return x.kind == Kind::kBulkDone && x.token == 3; }).status.ok());
  REQUIRE(in2 == Pattern(5, in2.size()));
}

// A peer whose link went down gives its connection up and connects again,
// while this side never saw the old one fail (its close could not reach us).
// Messages to that peer go to the new connection, not into the abandoned
// one, and the peer is never reported down meanwhile. (The coordinator's
// halt and pull to an agent that reconnected were lost that way: the
// recovery never started.) Two in-process transports with one id stand for
// the peer before and after its reconnect.
TEST_CASE("transport: a peer that connects again is reached on its new connection, not the abandoned one") {
  std::string dir = TempDir();
  std::string secret = SecretIn(dir, "secret");
  auto coord = Make(1, secret);
  auto before = Make(7, secret);  // the old connection: still open, never used by the peer again
  auto after = Make(7, secret);
  std::vector<TransportEvent> seen, seen_before, seen_after;
  before->Connect(1, coord->address());
  WaitFor(*before, seen_before, IsKind(Kind::kPeerUp, 1));
  WaitFor(*coord, seen, IsKind(Kind::kPeerUp, 7));
  coord->Send(7, 3, "first");
  REQUIRE(WaitFor(*before, seen_before, IsMsg(1, 3)).payload == "first");
  after->Connect(1, coord->address());
  WaitFor(*after, seen_after, IsKind(Kind::kPeerUp, 1));
  after->Send(1, 4, "registered again");
  REQUIRE(WaitFor(*coord, seen, IsMsg(7, 4)).payload == "registered again");  // the new connection is up here
  for (int i = 0; i < 20; ++i) coord->Send(7, 5, "halt " + std::to_string(i));
  for (int i = 0; i < 20; ++i) REQUIRE(WaitFor(*after, seen_after, IsMsg(1, 5)).payload == "halt " + std::to_string(i));
  for (const TransportEvent& e : seen) REQUIRE(!(e.kind == Kind::kPeerDown && e.peer == 7));
  for (auto& e : coord->Poll()) REQUIRE(!(e.kind == Kind::kPeerDown && e.peer == 7));
  for (const TransportEvent& e : seen_before) REQUIRE(!(e.kind == Kind::kMessage && e.type == 5));
}

TEST_CASE("transport: a secret file readable by others or malformed is refused with its name") {
  std::string dir = TempDir();
  std::string path = SecretIn(dir, "secret");
  std::string s;
  REQUIRE(ReadSecretFile(path, &s).ok());
  REQUIRE(s.size() == 2 * kSecretBytes);
  ::chmod(path.c_str(), 0644);
  Status st = ReadSecretFile(path, &s);
  REQUIRE(st.message().find(path) != std::string::npos);
  REQUIRE(st.message().find("0600") != std::string::npos);
  ::chmod(path.c_str(), 0600);
  std::ofstream(path) << "short\n";
  st = ReadSecretFile(path, &s);
  REQUIRE(st.message().find("hex digits") != std::string::npos);
  REQUIRE(!ReadSecretFile(dir + "/missing", &s).ok());
  REQUIRE(!WriteNewSecretFile(path).ok());  // never overwrites
}

// ---- [security]: what an attacker on the agents' port gets (nothing) ----

// transport_rogue in its own process; its stdout (one line per event) goes to
// a file the test reads.
class Rogue {
 public:
  Rogue(const std::string& dir, const std::string& name, std::vector<std::string> args)
      : out_(dir + "/" + name + ".out") {
    args.insert(args.begin(), std::string(FTRUN_BINARY_DIR) + "/tests/transport_rogue");
    pid_ = Spawn(std::move(args), out_);
  }
  ~Rogue() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool Says(const std::string& text, int seconds = 20) const { return FileHas(out_, text, seconds); }
  std::string output() const { return ReadFile(out_); }
  // Waits for it to exit; its exit status.
  int Wait(int seconds = 120) {
    auto deadline = Clock::now() + std::chrono::seconds(seconds);
    int status = 0;
    while (Clock::now() < deadline) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL("transport_rogue did not finish within " << seconds << " s");
    return -1;
  }

 private:
  std::string out_;
  pid_t pid_ = 0;
};

std::string RelayAddress(const std::string& file) {
  std::string address;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    std::ifstream f(file);
    if (f >> address) return address;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL("transport_rogue did not listen within 20 s");
  return {};
}

// The victim is alive and talks to a peer that connects to it directly.
void RequireServes(Transport& t, std::vector<TransportEvent>& seen, PeerId id, const std::string& address) {
  t.Connect(id, address);
  WaitFor(t, seen, IsKind(Kind::kPeerUp, id));
  t.Send(id, 1, "still serving?");
  WaitFor(t, seen, [&](const TransportEvent& e) { return IsMsg(id, 2)(e) && e.payload == "still serving?"; });
}

// A process that gets one agent's connection (say on a dead peer's port,
// as "peer 9") relays that agent's hello to another agent (7). The hello
// was made for 9 and this connection's nonces: 7 refuses it, says so, and
// the relay's own message (an exit) never gets in.
TEST_CASE("transport: a hello relayed to another peer is refused and logged", "[security]") {
  std::string dir = TempDir();
  std::string secret = SecretIn(dir, "secret");
  Peer victim(dir, 7, secret, dir + "/victim.log");
  auto t = Make(1, secret);
  std::vector<TransportEvent> seen;
  Rogue relay(dir, "relay",
              {"relay", "--address-file", dir + "/relay.addr", "--target", victim.address(), "--inject", "exit",
               "--seconds", "30"});
  t->Connect(9, RelayAddress(dir + "/relay.addr"));  // it thinks the relay is peer 9
  REQUIRE(!WaitFor(*t, seen, IsKind(Kind::kPeerDown, 9)).status.ok());
  INFO("victim's log:\n" << ReadFile(dir + "/victim.log") << "relay's events:\n" << relay.output());
  REQUIRE(FileHas(dir + "/victim.log", "refused a peer at"));
  REQUIRE(ReadFile(dir + "/victim.log").find("relayed") != std::string::npos);
  REQUIRE(relay.output().find("welcomed") == std::string::npos);
  RequireServes(*t, seen, 7, victim.address());
}

// A relay between two agents that share the secret can pass the handshake
// on (it is between them), but it does not have the session key: a message
// it changes or sends twice is refused, logged, and the connection closed;
// the victim keeps serving.
TEST_CASE("transport: a message tampered with or replayed on a relayed connection is refused and logged",
          "[security]") {
  for (std::string how : {"tamper", "replay"}) {
    INFO(how);
    std::string dir = TempDir();
    std::string secret = SecretIn(dir, "secret");
    Peer victim(dir, 7, secret, dir + "/victim.log");
    auto t = Make(1, secret);
    std::vector<TransportEvent> seen;
    Rogue relay(dir, "relay",
                {"relay", "--address-file", dir + "/relay.addr", "--target", victim.address(), "--inject", how,
                 "--seconds", "30"});
    t->Connect(7, RelayAddress(dir + "/relay.addr"));
    WaitFor(*t, seen, IsKind(Kind::kPeerUp, 7));  // a true relay: the handshake is the two peers'
    t->Send(7, 1, "ping through the relay");
    REQUIRE(relay.Says("injected"));
    // The victim closes the relayed connection (the relay passes the close on).
    REQUIRE(!WaitFor(*t, seen, IsKind(Kind::kPeerDown, 7)).status.ok());
    INFO("victim's log:\n" << ReadFile(dir + "/victim.log"));
    REQUIRE(FileHas(dir + "/victim.log", "refused a"));
    REQUIRE(FileHas(dir + "/victim.log", how == "tamper" ? "MAC does not match" : "out of sequence"));
    for (const auto& e : seen)
      REQUIRE(!(e.kind == Kind::kMessage && e.type == 2 && e.payload != "ping through the relay"));
    RequireServes(*t, seen, 7, victim.address());
  }
}

// A client that only connects (no secret) floods tags 1..N (the replicator's
// first tags), as eager tag sends and as bulk active messages, before and
// while transfers run: every transfer still lands the sender's bytes, both
// into a peer process and into this one, and this one counts what it dropped.
TEST_CASE("transport: bulk data from a connection that never authenticated is dropped; transfers land intact",
          "[security]") {
  std::string dir = TempDir();
  std::string secret = SecretIn(dir, "secret");
  Peer victim(dir, 7, secret, dir + "/victim.log");
  auto t = Make(1, secret);
  std::vector<TransportEvent> seen;
  t->Connect(7, victim.address());
  WaitFor(*t, seen, IsKind(Kind::kPeerUp, 7));
  const uint64_t len = 4096;
  Rogue at_victim(dir, "rogue7",
                  {"eager", "--target", victim.address(), "--tags", "64", "--length", "4096", "--seconds", "60"});
  Rogue at_us(dir, "rogue1",
              {"eager", "--target", t->address(), "--tags", "64", "--length", "4096", "--seconds", "60"});
  REQUIRE(at_victim.Says("sent"));
  REQUIRE(at_us.Says("sent"));
  uint64_t token = 1;
  for (uint64_t tag : {1, 2, 3, 17, 64}) {
    INFO("tag " << tag);
    std::vector<char> data = Pattern(tag, len);
    t->Send(7, 3, U64s({tag, len}));  // the victim posts a receive under `tag`
    WaitFor(*t, seen, IsMsg(7, 8));
    t->SendBulk(7, tag, data.data(), len, token);
    REQUIRE(WaitFor(*t, seen, [&](const TransportEvent& e) {
              return e.kind == Kind::kBulkDone && e.token == token;
            }).status.ok());
    ++token;
    std::string reply = WaitFor(*t, seen, IsMsg(7, 4)).payload;
    ByteReader r(reply);
    REQUIRE(r.Get<uint32_t>() == 0);
    REQUIRE(r.Get<uint64_t>() == XXH64(data.data(), len, 0));  // the victim got our bytes, not the flood's
    std::vector<char> in(len);
    t->PostRecv(7, tag, in.data(), len, token);  // and we get the victim's
    t->Send(7, 5, U64s({tag, len, tag + 1000}));
    REQUIRE(WaitFor(*t, seen, [&](const TransportEvent& e) {
              return e.kind == Kind::kBulkDone && e.token == token;
            }).status.ok());
    REQUIRE(in == Pattern(tag + 1000, len));
    ++token;
  }
  REQUIRE(t->stats().bulk_dropped > 0);
}

// Connections that come and go (or come and say nothing) from a client
// without the secret: the transport frees the closed ones and caps those in
// their handshake, so memory stays bounded; then it still works.
TEST_CASE("transport: connect/close churn and silent connections keep the connection count bounded", "[security]") {
  std::string dir = TempDir();
  std::string secret = SecretIn(dir, "secret");
  auto t = Make(1, secret);
  Rogue churn(dir, "churn", {"churn", "--target", t->address(), "--count", "2000"});
  REQUIRE(churn.Wait(300) == 0);
  INFO(churn.output());
  REQUIRE(churn.output().find("challenges 0 ") == std::string::npos);  // it did reach the handshake
  auto settled = [&](uint64_t bound) {
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (t->stats().connections > bound && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return t->stats().connections;
  };
  REQUIRE(settled(2) <= 2);
  {
    Rogue hold(dir, "hold", {"hold", "--target", t->address(), "--count", "300", "--seconds", "60"});
    REQUIRE(hold.Says("holding", 60));
    INFO("connections held: " << t->stats().connections);
    REQUIRE(t->stats().connections <= 64 + 2);
    REQUIRE(t->stats().refused > 0);
  }
  REQUIRE(settled(2) <= 2);  // the silent ones timed out or closed
  Peer peer(dir, 7, secret);
  std::vector<TransportEvent> seen;
  RequireServes(*t, seen, 7, peer.address());
}

}  // namespace
}  // namespace ftrun
