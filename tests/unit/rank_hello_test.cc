// A rank's hello: each reason a connection is refused as a rank is named,
// and only the process the agent started for the rank is taken.
#include "launcher/agent/rank_hello.h"

#include "plugin/common/bytes.h"
#include "tests/catch.h"

namespace ftrun {
namespace {

HelloCheck Good() {
  HelloCheck c;
  c.protocol = 7;
  c.job_id = "job";
  c.first_rank = 4;
  c.local_ranks = 2;
  c.running = true;
  c.is_local_rank = true;
  c.rank_pid = 1234;
  c.peer_pgid = 1234;
  c.peer_pid = 1240;
  return c;
}

RankHello Hi(int rank = 5, std::string job = "job") {
  RankHello h;
  h.protocol = 7;
  h.rank = rank;
  h.job = std::move(job);
  return h;
}

TEST_CASE("rank hello: the rank's own process in the job is taken", "[hello]") {
  CHECK(CheckHello(Hi(), Good()).ok());
  CHECK(CheckHello(Hi(5, ""), Good()).ok());  // a rank that does not know its job
}

TEST_CASE("rank hello: each refusal names why", "[hello]") {
  HelloCheck c = Good();
  RankHello h = Hi();
  h.protocol = 6;
  CHECK(CheckHello(h, c).message() == "client speaks protocol 6, agent 7");
  CHECK(CheckHello(Hi(5, "other"), c).message() == "client is in job 'other', this agent serves job 'job'");
  c.is_local_rank = false;
  Status s = CheckHello(Hi(9), c);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(s.message() == "rank 9 is not one of this node's ranks (4..5)");
  c = Good();
  c.running = false;
  CHECK(CheckHello(Hi(), c).message() == "rank 5 is being stopped");
  c = Good();
  c.rank_pid = 0;  // exited
  CHECK(CheckHello(Hi(), c).code() == Code::kUnavailable);
  c = Good();
  c.peer_pgid = 999;  // another process of the node's user
  CHECK(CheckHello(Hi(), c).message() == "pid 1240 is not rank 5's process (started by this agent as pid 1234)");
  c = Good();
  c.rank_connected = true;
  CHECK(CheckHello(Hi(), c).code() == Code::kAlreadyExists);
}

TEST_CASE("rank hello: a writer of the rank is taken beside the rank, from the rank's process group only", "[hello]") {
  RankHello h = Hi();
  h.role = HelloRole::kWriter;
  HelloCheck c = Good();
  c.rank_connected = true;  // the rank's own connection does not keep its writers out
  CHECK(CheckHello(h, c).ok());
  c.rank_connected = false;  // nor does its absence
  CHECK(CheckHello(h, c).ok());
  c.writers = kMaxWritersPerRank;
  Status s = CheckHello(h, c);
  CHECK(s.code() == Code::kResourceExhausted);
  CHECK(s.message() == "rank 5 has 4 writers connected (at most 4)");
  c = Good();
  c.peer_pgid = 999;  // a process outside the rank's group
  CHECK(CheckHello(h, c).message() == "pid 1240 is not rank 5's process (started by this agent as pid 1234)");
  c = Good();
  c.running = false;
  CHECK(CheckHello(h, c).message() == "rank 5 is being stopped");
  h.job = "other";
  CHECK(CheckHello(h, Good()).code() == Code::kFailedPrecondition);
}

TEST_CASE("rank hello: decoded as the client sends it; a short one is malformed", "[hello]") {
  ByteWriter w;
  w.Put<uint32_t>(7);
  w.Put<int32_t>(5);
  w.Put<int32_t>(4321);
  w.PutString("job");
  RankHello h;
  REQUIRE(RankHello::Decode(w.data(), &h).ok());
  CHECK((h.protocol == 7 && h.rank == 5 && h.job == "job" && h.role == HelloRole::kRank));
  CHECK(RankHello::Decode(w.data().substr(0, 9), &h).message() == "malformed hello");
  // The role byte: 0 the rank, 1 a writer of it; no byte (an older client) the rank; anything else refused.
  for (uint8_t role : {0, 1}) {
    ByteWriter with = w;
    with.Put<uint8_t>(role);
    REQUIRE(RankHello::Decode(with.data(), &h).ok());
    CHECK(h.role == static_cast<HelloRole>(role));
  }
  ByteWriter bad = w;
  bad.Put<uint8_t>(2);
  Status s = RankHello::Decode(bad.data(), &h);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(s.message() == "hello: role 2 is neither 0 (the rank) nor 1 (a writer of the rank)");
  bad = w;
  bad.Put<uint16_t>(1);  // trailing bytes after the role
  CHECK(RankHello::Decode(bad.data(), &h).message() == "malformed hello");

  const std::string ok = Encode(HelloOkMsg{"job", 3, 1 << 20, 17});
  ByteReader r(ok);
  CHECK(r.GetString() == "job");
  CHECK(r.Get<int32_t>() == 3);
  CHECK(r.Get<uint64_t>() == (1u << 20));
  CHECK(r.Get<uint8_t>() == 1);
  CHECK(r.Get<uint64_t>() == 17);
  CHECK((r.ok() && r.done()));
}

}  // namespace
}  // namespace ftrun
