// RankServer on a real unix socket and a real epoll loop, with a manual
// clock: frames reach the handler, replies reach the client, a silent
// connection is closed after its hello deadline, a protocol breach is cut
// off with an error, and connections without a hello are bounded.
#include "launcher/agent/rank_server.h"

#include <stdlib.h>
#include <unistd.h>

#include <vector>

#include "plugin/ipc/unix_socket.h"
#include "tests/catch.h"

namespace ftrun {
namespace {

constexpr uint64_t kListenTag = 1;

struct Server {
  std::string dir;
  EventLoop loop;
  ManualClock clock;
  std::vector<std::pair<MsgType, std::string>> frames;
  int closed = 0;
  std::unique_ptr<RankServer> server;

  Server() {
    char tmpl[] = "/tmp/ftrun-rank-server-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    REQUIRE(loop.Open({}, std::chrono::milliseconds(5)).ok());
    RankServer::Handler h;
    h.on_frame = [this](Connection& c, MsgType t, const std::string& p) {
      frames.emplace_back(t, p);
      if (t == MsgType::kList) (void)c.Send(MsgType::kListOk, "reply to " + p);
    };
    h.on_close = [this](Connection&) { closed++; };
    server = std::make_unique<RankServer>(&loop, clock, std::move(h));
    REQUIRE(server->Listen(path(), kListenTag).ok());
  }
  ~Server() {
    server.reset();
    ::unlink(path().c_str());
    ::rmdir(dir.c_str());
  }
  std::string path() const { return dir + "/agent.sock"; }
  // One round of the loop: what the agent's Loop does for the server.
  void Round() {
    std::vector<EventLoop::Ready> ready;
    REQUIRE(loop.Wait(&ready).ok());
    for (const auto& r : ready) {
      if (r.tag == kListenTag)
        server->Accept();
      else if (r.tag == EventLoop::kTickTag)
        loop.TakeTicks();
      else if (server->Owns(r.tag))
        server->Ready(r.tag, r.events);
    }
    server->Sync();
    server->Tick();
  }
  template <class Pred>
  bool RoundsUntil(Pred done) {
    for (int i = 0; i < 400 && !done(); ++i) Round();
    return done();
  }
  UniqueFd Connect() {
    UniqueFd fd;
    REQUIRE(ConnectUnix(path(), 1000, &fd).ok());
    return fd;
  }
};

TEST_CASE("rank server: frames reach the handler in order, replies reach the rank, a close is seen", "[rank_server]") {
  Server s;
  UniqueFd c = s.Connect();
  REQUIRE(SendFrame(c.get(), MsgType::kHello, "hi").ok());
  REQUIRE(SendFrame(c.get(), MsgType::kList, "list 1").ok());
  REQUIRE(s.RoundsUntil([&] { return s.frames.size() == 2; }));
  CHECK(s.frames[0].first == MsgType::kHello);
  CHECK(s.frames[1].second == "list 1");
  MsgType type;
  std::string payload;
  REQUIRE(RecvFrame(c.get(), 5000, &type, &payload).ok());
  CHECK(type == MsgType::kListOk);
  CHECK(payload == "reply to list 1");
  c.Reset();
  REQUIRE(s.RoundsUntil([&] { return s.closed == 1; }));
  CHECK(s.server->size() == 0);
}

TEST_CASE("rank server: a connection that says nothing is closed once its hello deadline has passed", "[rank_server]") {
  Server s;
  UniqueFd c = s.Connect();
  REQUIRE(s.RoundsUntil([&] { return s.server->size() == 1; }));
  s.Round();
  CHECK(s.closed == 0);  // within its deadline
  s.clock.Advance(RankServer::kHelloDeadline + std::chrono::seconds(1));
  s.Round();
  CHECK(s.closed == 1);
  MsgType type;
  std::string payload;
  CHECK_FALSE(RecvFrame(c.get(), 2000, &type, &payload).ok());  // the agent's end is closed
}

TEST_CASE("rank server: a hello frame over its size limit is cut off with an error that says so", "[rank_server]") {
  Server s;
  UniqueFd c = s.Connect();
  std::string big(Connection::kMaxHelloFrame + 1, 'x');
  (void)SendFrame(c.get(), MsgType::kHello, big);  // the server may close before it is all written
  REQUIRE(s.RoundsUntil([&] { return s.closed == 1; }));
  CHECK(s.frames.empty());
  MsgType type;
  std::string payload;
  REQUIRE(RecvFrame(c.get(), 2000, &type, &payload).ok());
  REQUIRE(type == MsgType::kError);
  INFO(DecodeError(payload).message());
  CHECK(DecodeError(payload).message().find(std::to_string(Connection::kMaxHelloFrame)) != std::string::npos);
}

TEST_CASE("rank server: connections that have not said hello are bounded", "[rank_server]") {
  Server s;
  s.server->set_max_pending_hello(0);  // the floor is 64
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 64; ++i) clients.push_back(s.Connect());
  REQUIRE(s.RoundsUntil([&] { return s.server->size() == 64; }));
  UniqueFd extra = s.Connect();
  for (int i = 0; i < 5; ++i) s.Round();
  CHECK(s.server->size() == 64);
  MsgType type;
  std::string payload;
  CHECK_FALSE(RecvFrame(extra.get(), 2000, &type, &payload).ok());  // refused: closed at once
}

}  // namespace
}  // namespace ftrun
