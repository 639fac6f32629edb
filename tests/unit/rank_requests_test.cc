// RankRequests with a real rank process (/bin/sh, leading its own group),
// real Generations over a hosted coordinator, a real store service, and a
// connection over a real socketpair: a hello from the rank's own process
// is taken (the answer carries the store's descriptor), one from anyone
// else is refused, a request before the hello or after the generation
// stopped is refused, and a closed connection frees the rank's slot.
#include "launcher/agent/rank_requests.h"

#include <sys/socket.h>

#include "plugin/common/bytes.h"
#include "plugin/ipc/wire.h"
#include "tests/unit/agent_parts_fixture.h"

namespace ftrun {
namespace {

using agent_parts::Node;

struct Wired {
  Node node{"sleep 300"};
  SaveStalls stalls;
  RankRequests requests{RankRequests::Parts{node.server.get(), &node.ranks, node.gens.get(), &node.service,
                                            &node.corrupt, nullptr, &stalls},
                        [] { return RankRequests::Place{"job", 0, 0, 2, 4096, 0}; }, node.clock};
  Connection conn;
  UniqueFd peer;  // the rank's end
  FrameReader replies;

  explicit Wired(pid_t pid) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    conn.fd = UniqueFd(sv[0]);
    peer = UniqueFd(sv[1]);
    conn.id = 7;
    conn.pid = pid;
    replies.set_accept_fds(true);
  }
  static std::string Hello(int rank, const std::string& job = "job") {
    ByteWriter w;
    w.Put<uint32_t>(kProtocolVersion);
    w.Put<int32_t>(rank);
    w.Put<int32_t>(0);
    w.PutString(job);
    return w.data();
  }
  // The next reply on the rank's end.
  MsgType Reply(std::string* payload = nullptr, UniqueFd* fd = nullptr) {
    std::string p;
    MsgType type{};
    for (int i = 0; i < 100; ++i) {
      if (replies.Next(&type, &p, fd)) {
        if (payload) *payload = p;
        return type;
      }
      REQUIRE(replies.ReadFrom(peer.get()).ok());
    }
    FAIL("no reply");
    return type;
  }
};

// Until the fork of `pid` has exec'd /bin/sh (its group is set by then).
void WaitExeced(pid_t pid) {
  for (int i = 0; i < 500 && ::getpgid(pid) != pid; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

TEST_CASE("rank requests: a hello from the rank's own process is taken, and its requests count as progress",
          "[rank_requests]") {
  Wired w(0);
  Node* n = &w.node;
  REQUIRE(n->gens->running());
  RankProcesses::Slot& slot = n->ranks.slots()[1];
  const pid_t rank1 = slot.pid;
  WaitExeced(rank1);
  w.conn.pid = rank1;
  w.requests.Frame(w.conn, MsgType::kHello, Wired::Hello(1));
  UniqueFd store_fd;
  std::string payload;
  REQUIRE(w.Reply(&payload, &store_fd) == MsgType::kHelloOk);
  CHECK(store_fd.valid());  // the store's memory rides on the answer
  CHECK(w.conn.rank == 1);
  CHECK(w.conn.generation == 0);
  CHECK(slot.conn_id == 7);
  CHECK(slot.connected != Clock::Time{});
  n->clock.Advance(std::chrono::seconds(5));
  w.requests.Frame(w.conn, MsgType::kProgress, "");
  CHECK(slot.last_progress == n->clock.Now());
  SECTION("a save's stall is counted with no reply; a malformed one counts nothing") {
    w.requests.Frame(w.conn, MsgType::kSaveStall, EncodeSaveStall(3, 0.004));
    w.requests.Frame(w.conn, MsgType::kSaveStall, "short");
    CHECK(w.stalls.count() == 1);
    CHECK(w.stalls.sum_seconds() == Approx(0.004));
    w.requests.Frame(w.conn, MsgType::kList, "");
    CHECK(w.Reply() == MsgType::kListOk);  // the next reply is the list's: nothing answered the reports
  }
  SECTION("a second hello for the same rank is refused") {
    Connection again;
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    again.fd = UniqueFd(sv[0]);
    UniqueFd other(sv[1]);
    again.id = 8;
    again.pid = rank1;
    w.requests.Frame(again, MsgType::kHello, Wired::Hello(1));
    FrameReader refusal;
    MsgType type{};
    std::string why;
    REQUIRE(refusal.ReadFrom(other.get()).ok());
    REQUIRE(refusal.Next(&type, &why));
    CHECK(type == MsgType::kError);
    CHECK(why.find("already connected") != std::string::npos);
    CHECK(again.rank == -1);
    CHECK(slot.conn_id == 7);
  }
  SECTION("once the generation stops, its requests are refused") {
    n->gens->Signal(SIGTERM);
    w.requests.Frame(w.conn, MsgType::kProgress, "");
    REQUIRE(w.Reply(&payload) == MsgType::kError);
    CHECK(payload.find("not an accepted rank of the current generation") != std::string::npos);
  }
  SECTION("a closed connection frees the rank's slot") {
    w.requests.Closed(w.conn);
    CHECK(slot.conn_id == 0);
  }
}

TEST_CASE("rank requests: a hello from another process, or a request before any hello, is refused", "[rank_requests]") {
  Wired w(::getpid());  // this test: not the rank's process, not leading its group
  REQUIRE(w.node.gens->running());
  std::string payload;
  SECTION("hello") {
    w.requests.Frame(w.conn, MsgType::kHello, Wired::Hello(1));
    REQUIRE(w.Reply(&payload) == MsgType::kError);
    CHECK(w.conn.rank == -1);
    CHECK(w.node.ranks.slots()[1].conn_id == 0);
  }
  SECTION("a malformed hello") {
    w.requests.Frame(w.conn, MsgType::kHello, "xx");
    REQUIRE(w.Reply(&payload) == MsgType::kError);
    CHECK(payload.find("malformed hello") != std::string::npos);
  }
  SECTION("a request before the hello") {
    w.requests.Frame(w.conn, MsgType::kProgress, "");
    REQUIRE(w.Reply(&payload) == MsgType::kError);
    CHECK(payload.find("not an accepted rank") != std::string::npos);
  }
}

}  // namespace
}  // namespace ftrun
