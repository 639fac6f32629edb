// Subsets: every subset of a given size, for tests that try every failure
// pattern.
#pragma once

#include <vector>

namespace ftrun {

// Calls f(subset) for every subset of 0..n-1 with `size` members, in
// lexicographic order.
template <typename F>
void Subsets(int n, int size, F f, std::vector<int> cur = {}, int from = 0) {
  if (static_cast<int>(cur.size()) == size) return f(cur);
  for (int i = from; i < n; ++i) {
    cur.push_back(i);
    Subsets(n, size, f, cur, i + 1);
    cur.pop_back();
  }
}

}  // namespace ftrun
