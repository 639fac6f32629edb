#include "launcher/agent/connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "tests/catch.h"

using namespace ftrun;

namespace {

// The agent's end of a non-blocking socket pair, and the rank's.
void Pair(Connection* conn, UniqueFd* peer) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  conn->fd.Reset(sv[0]);
  peer->Reset(sv[1]);
}

}  // namespace

TEST_CASE("a peer that does not read never blocks the agent's sends", "[agent]") {
  Connection conn;
  UniqueFd peer;
  Pair(&conn, &peer);
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  UniqueFd pr(pipefd[0]), pw(pipefd[1]);

  // The first frame carries a descriptor; then far more than the socket
  // buffer holds, while nobody reads.
  REQUIRE(conn.Send(MsgType::kHelloOk, "hello", pw.get()).ok());
  const std::string big(1 << 20, 'b');
  for (int i = 0; i < 8; ++i) REQUIRE(conn.Send(MsgType::kLoadOk, big + std::to_string(i)).ok());
  CHECK(conn.want_write);

  // The peer reads; the agent (here a thread) flushes whenever there is room.
  std::thread agent([&] {
    while (conn.want_write && !conn.broken) {
      (void)conn.Flush();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  MsgType type;
  std::string payload;
  UniqueFd got;
  std::vector<std::string> frames;
  Status s;
  while (frames.size() < 9 && s.ok()) {
    s = RecvFrame(peer.get(), 5000, &type, &payload, frames.empty() ? &got : nullptr);
    frames.push_back(payload);
  }
  agent.join();
  REQUIRE(s.ok());
  CHECK(frames[0] == "hello");
  CHECK(got.valid());
  for (int i = 0; i < 8; ++i) CHECK(frames[static_cast<size_t>(i) + 1] == big + std::to_string(i));
  CHECK_FALSE(conn.want_write);
  CHECK_FALSE(conn.broken);
}

TEST_CASE("a peer that stops reading for good is cut off, not buffered forever", "[agent]") {
  Connection conn;
  UniqueFd peer;
  Pair(&conn, &peer);
  const std::string big(1 << 20, 'x');
  Status s;
  for (size_t i = 0; i <= Connection::kMaxOutbox / big.size() + 1 && s.ok(); ++i) s = conn.Send(MsgType::kLoadOk, big);
  CHECK(s.code() == Code::kUnavailable);
  CHECK(conn.broken);
  CHECK_FALSE(conn.Send(MsgType::kError, "").ok());  // the first failure sticks
}
