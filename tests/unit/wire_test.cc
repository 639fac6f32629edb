#include "plugin/ipc/wire.h"

#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "tests/catch.h"

using namespace ftrun;

TEST_CASE("frames and a passed descriptor cross a socket", "[wire]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  UniqueFd a(sv[0]), b(sv[1]);
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  UniqueFd pr(pipefd[0]), pw(pipefd[1]);
  REQUIRE(SendFrame(a.get(), MsgType::kHelloOk, "payload", pw.get()).ok());
  MsgType type;
  std::string payload;
  UniqueFd got;
  REQUIRE(RecvFrame(b.get(), 1000, &type, &payload, &got).ok());
  CHECK(type == MsgType::kHelloOk);
  CHECK(payload == "payload");
  REQUIRE(got.valid());
  REQUIRE(::write(got.get(), "x", 1) == 1);  // the received fd is the pipe's write end
  char c = 0;
  REQUIRE(::read(pr.get(), &c, 1) == 1);
  CHECK(c == 'x');
}

TEST_CASE("FrameReader reassembles frames split across reads", "[wire]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  UniqueFd a(sv[0]), b(sv[1]);
  std::string big(200000, 'z');
  REQUIRE(SendFrame(a.get(), MsgType::kSave, "one").ok());
  FrameReader r;
  MsgType type;
  std::string payload;
  REQUIRE(r.ReadFrom(b.get()).ok());
  REQUIRE(r.Next(&type, &payload));
  CHECK(payload == "one");
  CHECK_FALSE(r.Next(&type, &payload));
  // A large frame arrives in pieces.
  Status sent;
  std::thread t([&] { sent = SendFrame(a.get(), MsgType::kSave, big); });
  bool done = false;
  while (!done) {
    REQUIRE(r.ReadFrom(b.get()).ok());
    done = r.Next(&type, &payload);
  }
  t.join();
  CHECK(sent.ok());
  CHECK(payload == big);
  a.Reset();
  CHECK(r.ReadFrom(b.get()).code() == Code::kUnavailable);
}

TEST_CASE("garbage on the socket is refused as corruption", "[wire]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  UniqueFd a(sv[0]), b(sv[1]);
  REQUIRE(::write(a.get(), "GET / HTTP/1.1\r\n\r\n", 18) == 18);
  FrameReader r;
  REQUIRE(r.ReadFrom(b.get()).ok());
  MsgType type;
  std::string payload;
  CHECK_FALSE(r.Next(&type, &payload));
  CHECK(r.status().code() == Code::kCorruption);
  MsgType t2;
  CHECK(RecvFrame(a.get(), 50, &t2, &payload).code() == Code::kTimeout);
}

TEST_CASE("errors round-trip with their code", "[wire]") {
  Status s = DecodeError(EncodeError(Status::ResourceExhausted("full")));
  CHECK(s.code() == Code::kResourceExhausted);
  CHECK(s.message() == "full");
}
