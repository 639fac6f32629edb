// The coordinator's membership (recovery/membership.h): the job's ranks per
// slot, an agent registering again for another place leaving its old one,
// spares, and what each agent is told about the others (its holders, the
// slots it holds, its erasure group).
#include "recovery/membership.h"

#include <algorithm>

#include "tests/catch.h"

namespace ftrun {
namespace {

bool Knows(const MembershipMsg& m, PeerId id) {
  return std::any_of(m.members.begin(), m.members.end(), [&](const MemberInfo& x) { return x.agent == id; });
}

TEST_CASE("Membership: ranks per slot, first rank and world size", "[membership]") {
  Membership m({{2, 3, 1}, 10, 64, {}, 1, 0, 0});
  CHECK(m.slots() == 3);
  CHECK(m.FirstRank(0) == 10);
  CHECK(m.FirstRank(2) == 15);
  CHECK(m.EndRank() == 16);
  CHECK(m.RankCount() == 6);
  CHECK(m.WorldSize() == 64);
  CHECK(m.SlotRanks(1) == std::vector<int>{12, 13, 14});
  CHECK(m.SlotOfRank(10) == 0);
  CHECK(m.SlotOfRank(14) == 1);
  CHECK(m.SlotOfRank(15) == 2);
  CHECK(m.Rack(1).empty());  // racks padded to the slots
  CHECK(m.replicas() == 1);
  Membership whole({{2, 2}, 0, 0, {}, 1, 0, 0});
  CHECK(whole.WorldSize() == 4);  // 0: the job's ranks
}

TEST_CASE("Membership: an agent registering for another place leaves its old one", "[membership]") {
  Membership m({{1, 1, 1}, 0, 0, {}, 1, 0, 0});
  const auto t = Membership::Time{};
  auto [a, left] = m.Register(7, "h:1", "", 0, t);
  CHECK_FALSE(left);
  m.Assign(*a, 0);
  CHECK(m.Holder(0) == PeerId{7});
  CHECK_FALSE(m.Full());
  CHECK(m.Vacant() == std::vector<int>{1, 2});
  // The same agent again, as a spare: node 0 is vacant, and it starts afresh.
  auto [again, left2] = m.Register(7, "h:2", "", -1, t);
  CHECK(left2 == 0);
  CHECK_FALSE(m.Holder(0));
  CHECK(again->slot == -1);
  CHECK(again->address == "h:2");
  CHECK(m.FirstSpare() == again);
  again->alive = false;
  CHECK(m.FirstSpare() == nullptr);  // a lost agent is no spare
  CHECK_FALSE(m.Alive(7));
  CHECK_FALSE(m.Alive(8));  // never registered
  CHECK(m.Find(8) == nullptr);
}

TEST_CASE("Membership: each agent is told its holders and the slots it holds", "[membership]") {
  Membership m({{1, 1, 1, 1}, 0, 0, {}, 1, 0, 0});
  const auto t = Membership::Time{};
  for (int s = 0; s < 4; ++s) m.Assign(*m.Register(static_cast<PeerId>(s + 1), "h", "", s, t).first, s);
  auto* spare = m.Register(9, "spare", "", -1, t).first;
  for (int s = 0; s < 4; ++s) {
    MembershipMsg msg = m.MessageFor(*m.SlotAgent(s), 5);
    CHECK(msg.epoch == 5);
    CHECK(msg.members.front().agent == static_cast<PeerId>(s + 1));  // itself first
    REQUIRE(msg.my_holders.size() == 1);
    const int holder = m.HoldersOf(s).front();
    CHECK(msg.my_holders.front() == static_cast<PeerId>(holder + 1));
    CHECK(Knows(msg, msg.my_holders.front()));
    REQUIRE(msg.held_slots.size() == 1);  // one replica each: every slot holds one other
    CHECK(Knows(msg, static_cast<PeerId>(msg.held_slots.front() + 1)));
    CHECK_FALSE(Knows(msg, 9));
    CHECK(msg.group.empty());
  }
  MembershipMsg told = m.MessageFor(*spare, 5);  // a spare: only itself
  CHECK(told.members.size() == 1);
  CHECK(told.my_holders.empty());
}

TEST_CASE("Membership: with an erasure code, no replicas and the group by member", "[membership]") {
  Membership m({{1, 1, 1, 1, 1, 1}, 0, 0, {}, 1, 2, 1});
  CHECK(m.erasure());
  CHECK(m.groups().size() == 2);
  CHECK(m.HoldersOf(0).empty());  // the code replaces copies
  CHECK(m.replicas() == 0);
  const auto t = Membership::Time{};
  for (int s = 0; s < 5; ++s) m.Assign(*m.Register(static_cast<PeerId>(s + 1), "h", "", s, t).first, s);
  const auto [group, member] = m.GroupOf(0);
  MembershipMsg msg = m.MessageFor(*m.SlotAgent(0), 1);
  CHECK(msg.erasure_data == 2);
  CHECK(msg.erasure_parity == 1);
  CHECK(msg.group_member == member);
  const std::vector<int>& slots = m.groups()[static_cast<size_t>(group)];
  REQUIRE(msg.group.size() == slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    // Slot 5 has no agent: its member is kNoAgent.
    CHECK(msg.group[i] == (slots[i] == 5 ? kNoAgent : static_cast<PeerId>(slots[i] + 1)));
  }
}

}  // namespace
}  // namespace ftrun
