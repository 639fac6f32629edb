// Every cluster message: what Encode writes, Decode reads back whole; a
// payload cut short or with bytes left over is refused, naming the message.
#include "plugin/protocol/cluster_messages.h"

#include "tests/catch.h"

namespace ftrun {
namespace {

// Encode, decode, compare with `same`; then every shorter payload and one
// with a trailing byte must fail to decode, with a message naming the type.
template <class M, class Same>
void RoundTrip(const M& m, Same same, bool prefix_ok = false) {
  const std::string p = Encode(m);
  M back;
  REQUIRE(Decode(p, &back).ok());
  CHECK(same(m, back));
  if (prefix_ok) return;
  for (size_t n = 0; n < p.size(); ++n) {
    M cut;
    Status s = Decode(p.substr(0, n), &cut);
    INFO(ClusterMsgName(M::kType) << " cut to " << n << " of " << p.size() << " bytes");
    REQUIRE(!s.ok());
    CHECK(s.message().find(ClusterMsgName(M::kType)) != std::string::npos);
  }
  M longer;
  CHECK(!Decode(p + "x", &longer).ok());
}

TEST_CASE("cluster messages: each decodes what its encoder wrote, and refuses a payload cut short or too long",
          "[cluster_messages][security]") {
  RoundTrip(HeartbeatMsg{7}, [](auto& a, auto& b) { return a.epoch == b.epoch; });
  RoundTrip(HaltedMsg{8}, [](auto& a, auto& b) { return a.epoch == b.epoch; });
  RoundTrip(ReadyMsg{9}, [](auto& a, auto& b) { return a.epoch == b.epoch; });
  RoundTrip(NodeDoneMsg{10}, [](auto& a, auto& b) { return a.epoch == b.epoch; });
  RoundTrip(HaltMsg{11}, [](auto& a, auto& b) { return a.epoch == b.epoch; });
  RoundTrip(CoordHeartbeatMsg{12}, [](auto& a, auto& b) { return a.epoch == b.epoch; });
  auto rv = [](auto& a, auto& b) { return a.epoch == b.epoch && a.items == b.items; };
  RoundTrip(HeldMsg{3, {{0, 5}, {1, 5}}}, rv);
  RoundTrip(DroppedMsg{3, {{2, 9}}, "rank 2 tensor 'w' chunk #0 of version 9 is corrupted"},
            [](auto& a, auto& b) { return a.epoch == b.epoch && a.items == b.items && a.why == b.why; });
  RoundTrip(MissingMsg{4, {}}, rv);
  auto ev = [](auto& a, auto& b) { return a.epoch == b.epoch && a.version == b.version; };
  RoundTrip(RoundFailedMsg{2, 77}, ev);
  RoundTrip(ReplicateMsg{2, 78}, ev);
  RoundTrip(RankFailedMsg{5, 137, "rank 3 killed by signal 9 (SIGKILL)", true}, [](auto& a, auto& b) {
    return a.epoch == b.epoch && a.code == b.code && a.reason == b.reason && a.early == b.early;
  });
  RoundTrip(FatalMsg{6, "another job's files", 2},
            [](auto& a, auto& b) { return a.epoch == b.epoch && a.message == b.message && a.code == b.code; });
  RoundTrip(PullFailedMsg{6, 3, 40, "agent 2 is down"}, [](auto& a, auto& b) {
    return a.epoch == b.epoch && a.rank == b.rank && a.version == b.version && a.message == b.message;
  });
  RoundTrip(DiskFailedMsg{6, 40, "chunk file 'x': its bytes hash to y"},
            [](auto& a, auto& b) { return a.epoch == b.epoch && a.version == b.version && a.message == b.message; });
  RoundTrip(CommitMsg{41, 6}, [](auto& a, auto& b) { return a.version == b.version && a.epoch == b.epoch; });
  RoundTrip(StopMsg{3, "giving up"}, [](auto& a, auto& b) { return a.code == b.code && a.message == b.message; });
  RoundTrip(DropAboveMsg{40}, [](auto& a, auto& b) { return a.version == b.version; });
  RoundTrip(RegisterMsg{2, "10.0.0.3:7", "rack-a", 5, 40, {{4, 40}, {5, 40}}, 40}, [](auto& a, auto& b) {
    return a.slot == b.slot && a.address == b.address && a.rack == b.rack && a.epoch == b.epoch &&
           a.committed == b.committed && a.catalog == b.catalog && a.parity == b.parity;
  });
  RoundTrip(StartMsg{4, 39, "10.0.0.1", 29500, "10.0.0.9:41234"}, [](auto& a, auto& b) {
    return a.epoch == b.epoch && a.version == b.version && a.master_addr == b.master_addr &&
           a.master_port == b.master_port && a.store == b.store;
  });
  RoundTrip(StartMsg{0, std::nullopt, "h", 1, ""}, [](auto& a, auto& b) { return !b.version && b.store == a.store; });
  RoundTrip(
      FencedMsg{"node 1 was given to agent 4"}, [](auto& a, auto& b) { return a.message == b.message; },
      /*prefix_ok=*/true);  // its payload is its message
  MembershipMsg m;
  m.epoch = 3;
  m.members = {{0, 0, "10.0.0.1:1", 0, 2}, {1, -1, "10.0.0.2:1", 0, 0}};
  m.my_holders = {1};
  m.held_slots = {1, 2};
  RoundTrip(m, [](auto& a, auto& b) {
    return a.epoch == b.epoch && a.members.size() == b.members.size() && b.members[0].ranks == 2 &&
           b.members[1].slot == -1 && a.my_holders == b.my_holders && a.held_slots == b.held_slots;
  });
}

TEST_CASE("cluster messages: a membership naming ranks for a spare, or negative ranks, is refused",
          "[cluster_messages][security]") {
  MembershipMsg m;
  m.members = {{4, -1, "10.0.0.5:1", 0, 2}};  // a spare that runs ranks
  MembershipMsg back;
  Status s = Decode(Encode(m), &back);
  REQUIRE(!s.ok());
  CHECK(s.message().find("agent 4") != std::string::npos);
  m.members = {{4, 1, "10.0.0.5:1", -3, 2}};
  CHECK(!Decode(Encode(m), &back).ok());
}

TEST_CASE("ByteWriter/ByteReader: optional u64 and u64 lists round-trip; a count beyond the bytes is refused",
          "[protocol]") {
  ByteWriter w;
  w.PutOptionalU64(std::nullopt);
  w.PutOptionalU64(uint64_t{7});
  w.PutU64s({});
  w.PutU64s({1, 2, ~0ull});
  ByteReader r(w.data());
  CHECK_FALSE(r.GetOptionalU64());
  CHECK(r.GetOptionalU64() == uint64_t{7});
  CHECK(r.GetU64s().empty());
  CHECK(r.GetU64s() == std::vector<uint64_t>{1, 2, ~0ull});
  CHECK(r.ok());
  CHECK(r.done());
  // A count of 3 with the bytes of 2: nothing allocated for it, the reader is bad.
  ByteWriter lie;
  lie.Put<uint32_t>(3);
  lie.Put<uint64_t>(1);
  lie.Put<uint64_t>(2);
  ByteReader bad(lie.data());
  CHECK(bad.GetU64s().empty());
  CHECK_FALSE(bad.ok());
  const std::string five(5, '\1');  // (the reader views it: it must outlive the reader)
  ByteReader short_optional(five);
  (void)short_optional.GetOptionalU64();
  CHECK_FALSE(short_optional.ok());
}

}  // namespace
}  // namespace ftrun
