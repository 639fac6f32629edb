#include "recovery/membership.h"

#include <algorithm>

#include "recovery/placement.h"

namespace ftrun {

Membership::Membership(Shape shape) : shape_(std::move(shape)), slots_(shape_.ranks_per_slot.size()) {
  shape_.racks.resize(shape_.ranks_per_slot.size());
  first_ranks_.push_back(shape_.first_rank);
  for (int n : shape_.ranks_per_slot) first_ranks_.push_back(first_ranks_.back() + n);
  if (erasure()) {
    shape_.replicas = 0;  // the code replaces copies
    groups_ = PlaceErasureGroups(shape_.racks, shape_.erasure_data + shape_.erasure_parity);
    group_of_.resize(shape_.ranks_per_slot.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t m = 0; m < groups_[g].size(); ++m)
        group_of_[static_cast<size_t>(groups_[g][m])] = {static_cast<int>(g), static_cast<int>(m)};
    }
    stripes_ = StripeLayout(shape_.erasure_data, shape_.erasure_parity);
  }
  placement_ = PlaceReplicas(shape_.racks, shape_.replicas);
  held_slots_.resize(placement_.size());
  for (size_t s = 0; s < placement_.size(); ++s) {
    for (int h : placement_[s]) held_slots_[static_cast<size_t>(h)].push_back(static_cast<int32_t>(s));
  }
}

std::vector<int> Membership::SlotRanks(int slot) const {
  std::vector<int> v;
  for (int i = 0; i < RanksOf(slot); ++i) v.push_back(FirstRank(slot) + i);
  return v;
}

int Membership::SlotOfRank(int rank) const {
  auto it = std::upper_bound(first_ranks_.begin(), first_ranks_.end(), rank);
  return static_cast<int>(it - first_ranks_.begin()) - 1;
}

Membership::Agent* Membership::Find(PeerId id) {
  auto it = agents_.find(id);
  return it == agents_.end() ? nullptr : &it->second;
}

bool Membership::Alive(PeerId id) const {
  auto it = agents_.find(id);
  return it != agents_.end() && it->second.alive;
}

std::pair<Membership::Agent*, std::optional<int>> Membership::Register(PeerId id, const std::string& address,
                                                                       const std::string& rack, int slot, Time now) {
  // An agent that holds a node and registers again for another place (a
  // spare, another node) leaves that node: it must not point at it.
  std::optional<int> left;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s] == id && static_cast<int>(s) != slot) left = static_cast<int>(s);
  }
  if (left) Vacate(*left);
  Agent& a = agents_[id];
  a = Agent{};
  a.id = id;
  a.address = address;
  a.rack = rack;
  a.last_heard = now;
  return {&a, left};
}

Membership::Agent* Membership::SlotAgent(int slot) {
  auto& id = slots_[static_cast<size_t>(slot)];
  return id ? &agents_.at(*id) : nullptr;
}

const Membership::Agent* Membership::SlotAgent(int slot) const {
  auto& id = slots_[static_cast<size_t>(slot)];
  return id ? &agents_.at(*id) : nullptr;
}

void Membership::Assign(Agent& a, int slot) {
  a.slot = slot;
  slots_[static_cast<size_t>(slot)] = a.id;
}

bool Membership::Full() const {
  return std::all_of(slots_.begin(), slots_.end(), [](const auto& s) { return s.has_value(); });
}

std::vector<int> Membership::Vacant() const {
  std::vector<int> v;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (!slots_[s]) v.push_back(static_cast<int>(s));
  }
  return v;
}

Membership::Agent* Membership::FirstSpare() {
  for (auto& [id, a] : agents_) {
    if (a.alive && a.slot < 0) return &a;
  }
  return nullptr;
}

MemberInfo Membership::Member(const Agent& a) const {
  MemberInfo x{a.id, a.slot, a.address};
  if (a.slot >= 0) {
    x.first_rank = FirstRank(a.slot);
    x.ranks = RanksOf(a.slot);
  }
  return x;
}

MembershipMsg Membership::MessageFor(const Agent& a, uint64_t epoch) const {
  MembershipMsg m;
  m.epoch = epoch;
  m.members.push_back(Member(a));
  auto add = [&](const Agent* x) {
    if (x == nullptr) return;
    for (const MemberInfo& known : m.members) {
      if (known.agent == x->id) return;
    }
    m.members.push_back(Member(*x));
  };
  if (a.slot < 0) return m;
  for (int h : placement_[static_cast<size_t>(a.slot)]) {
    if (const Agent* x = SlotAgent(h)) {
      m.my_holders.push_back(x->id);
      add(x);
    }
  }
  m.held_slots = held_slots_[static_cast<size_t>(a.slot)];
  for (int32_t s : m.held_slots) add(SlotAgent(s));
  if (!erasure()) return m;
  const auto [group, member] = group_of_[static_cast<size_t>(a.slot)];
  m.erasure_data = shape_.erasure_data;
  m.erasure_parity = shape_.erasure_parity;
  m.group_member = member;
  for (int s : groups_[static_cast<size_t>(group)]) {
    const Agent* x = SlotAgent(s);
    m.group.push_back(x ? x->id : kNoAgent);
    add(x);
  }
  return m;
}

std::string JoinNumbers(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace ftrun
