// Membership: the coordinator's picture of who is where. The job's nodes
// (slots) and their ranks, the agents registered (each on a slot or waiting
// as a spare), which slots hold copies of which (placement.h), and with an
// erasure code the groups and their stripes. It decides nothing and sends
// nothing: the coordinator (coordinator.h) assigns places and tells the
// agents; MessageFor says what one agent is told.
//
// Not thread-safe: owned by the coordinator.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plugin/erasure/stripe_layout.h"
#include "plugin/protocol/cluster_messages.h"
#include "plugin/transport/transport.h"

namespace ftrun {

class Membership {
 public:
  using Time = std::chrono::steady_clock::time_point;

  // The job's shape, as the coordinator's options give it.
  struct Shape {
    std::vector<int> ranks_per_slot;  // one entry per slot (node)
    int first_rank = 0;               // the job's ranks: first_rank .. + the sum of ranks_per_slot - 1
    int world_size = 0;               // what the ranks are told (0: that sum)
    std::vector<std::string> racks;   // per slot; "" = none (shorter: padded)
    int replicas = 0;                 // copies on other slots (0 with an erasure code)
    int erasure_data = 0;             // 0: no erasure code
    int erasure_parity = 0;
  };

  struct Agent {
    PeerId id = 0;
    std::string address;
    std::string rack;
    int slot = -1;  // -1: spare
    bool alive = true;
    Time last_heard;
    bool halted = false;  // since the recovery began
    bool ready = true;    // this epoch: pulled what it had to
    bool done = false;    // its ranks finished
    Time last_sent{};     // when it was last sent anything (a heartbeat fills only a silence)
  };

  explicit Membership(Shape shape);

  // The job's ranks and slots.
  int slots() const { return static_cast<int>(slots_.size()); }
  int FirstRank(int slot) const { return first_ranks_[static_cast<size_t>(slot)]; }
  int RanksOf(int slot) const { return shape_.ranks_per_slot[static_cast<size_t>(slot)]; }
  int FirstRank() const { return shape_.first_rank; }
  int EndRank() const { return first_ranks_.back(); }  // one past the job's last rank
  int RankCount() const { return EndRank() - shape_.first_rank; }
  int WorldSize() const { return shape_.world_size > 0 ? shape_.world_size : RankCount(); }
  std::vector<int> SlotRanks(int slot) const;
  int SlotOfRank(int rank) const;
  const std::string& Rack(int slot) const { return shape_.racks[static_cast<size_t>(slot)]; }

  // The agents. Agents declared lost stay, not alive.
  std::map<PeerId, Agent>& agents() { return agents_; }
  const std::map<PeerId, Agent>& agents() const { return agents_; }
  Agent* Find(PeerId id);
  bool Alive(PeerId id) const;
  // (Re)registers an agent: its old place, if it held another slot than
  // `slot`, is vacated (returned), and it starts afresh, not on any slot.
  std::pair<Agent*, std::optional<int>> Register(PeerId id, const std::string& address, const std::string& rack,
                                                 int slot, Time now);
  // The slot's agent, if any (alive or not yet declared lost).
  std::optional<PeerId> Holder(int slot) const { return slots_[static_cast<size_t>(slot)]; }
  Agent* SlotAgent(int slot);
  const Agent* SlotAgent(int slot) const;
  void Assign(Agent& a, int slot);
  void Vacate(int slot) { slots_[static_cast<size_t>(slot)].reset(); }
  bool Full() const;
  std::vector<int> Vacant() const;
  Agent* FirstSpare();  // an alive agent on no slot

  // Copies of each slot's ranks on other slots: 0 with an erasure code
  // (the code replaces copies).
  int replicas() const { return shape_.replicas; }
  // The slots that hold copies of `slot`'s ranks.
  const std::vector<int>& HoldersOf(int slot) const { return placement_[static_cast<size_t>(slot)]; }

  // Erasure coding: slot -> (group, member), a group's slots by member, and
  // the stripes of every group (members, not slots).
  bool erasure() const { return shape_.erasure_data > 0; }
  int erasure_data() const { return shape_.erasure_data; }
  int erasure_parity() const { return shape_.erasure_parity; }
  std::pair<int, int> GroupOf(int slot) const { return group_of_[static_cast<size_t>(slot)]; }
  const std::vector<std::vector<int>>& groups() const { return groups_; }
  const std::vector<Stripe>& stripes() const { return stripes_; }

  // What agent `a` is told in `epoch`: itself, its holders (it copies to
  // them; a replacement pulls from them), the agents of the slots it holds
  // (they copy to it, and pull from it), and its erasure group.
  MembershipMsg MessageFor(const Agent& a, uint64_t epoch) const;

 private:
  MemberInfo Member(const Agent& a) const;

  Shape shape_;
  std::vector<int> first_ranks_;                  // slot -> its first rank; [slots]: one past the last
  std::vector<std::vector<int>> placement_;       // slot -> holder slots
  std::vector<std::vector<int32_t>> held_slots_;  // slot -> the slots it holds copies of (placement_ inverted)
  std::vector<std::vector<int>> groups_;          // erasure group -> its slots, by member
  std::vector<std::pair<int, int>> group_of_;     // slot -> (group, member)
  std::vector<Stripe> stripes_;                   // StripeLayout(data, parity)
  std::map<PeerId, Agent> agents_;
  std::vector<std::optional<PeerId>> slots_;  // slot -> agent
};

// For the coordinator's messages naming ranks or nodes: "1, 2, 3".
std::string JoinNumbers(const std::vector<int>& v);

}  // namespace ftrun
