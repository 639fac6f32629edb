// StripeLayout: how a group of n = data + parity members protects its
// members' shards with a ReedSolomon(data, parity) code, holding data/parity
// of a shard in parity per member (1 + parity/data of its own state in RAM,
// against 1 + k for k replicas).
//
// Each member's shard is cut into `data` slices of equal length (the
// group's longest shard / data, rounded up; a shorter shard reads as zeros
// past its end). There is one stripe per member: stripe j codes one slice
// of each of `data` members into `parity` parity slices, held by members
// j, j+1, ..., j+parity-1 (mod n); its data fragment t is slice t of member
// j+parity+t (mod n). So every member gives each of its slices to exactly
// one stripe and holds exactly `parity` parity slices, and no stripe has two
// fragments on one member: any `parity` lost members cost every stripe at
// most `parity` fragments, which its code rebuilds from the others.
//
// Rebuilding a lost member: for each stripe it gave a slice to, decode that
// slice; for each stripe it held parity of, decode that parity (both from
// `data` surviving fragments of the stripe).
#pragma once

#include <cstddef>
#include <vector>

namespace ftrun {

struct StripeFragment {
  int member = 0;  // index in the group
  int slice = 0;   // which of the member's slices (data fragments only)
};

struct Stripe {
  std::vector<StripeFragment> data;  // fragments 0 .. data-1
  std::vector<int> parity;           // members holding fragments data .. data+parity-1
  // The member holding fragment f (data first, then parity).
  int MemberOf(int f) const {
    return f < static_cast<int>(data.size()) ? data[static_cast<std::size_t>(f)].member
                                             : parity[static_cast<std::size_t>(f) - data.size()];
  }
};

// The group's n = data + parity stripes; data >= 1, parity >= 1.
std::vector<Stripe> StripeLayout(int data, int parity);

}  // namespace ftrun
