#include "recovery/placement.h"

#include <algorithm>
#include <map>

namespace ftrun {

std::vector<int> RackRing(const std::vector<std::string>& racks) {
  const int n = static_cast<int>(racks.size());
  // Group slots by rack, then deal them round-robin, largest racks first, so
  // neighbours differ. A slot without a rack is a domain of its own, after
  // the named racks in slot order (slot 10 after slot 9).
  std::map<std::string, std::vector<int>> by_rack;
  std::vector<std::vector<int>> groups;
  for (int i = 0; i < n; ++i) {
    if (!racks[i].empty()) by_rack[racks[i]].push_back(i);
  }
  for (auto& [rack, slots] : by_rack) groups.push_back(slots);
  for (int i = 0; i < n; ++i) {
    if (racks[i].empty()) groups.push_back({i});
  }
  std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  std::vector<int> ring;
  for (size_t round = 0; ring.size() < static_cast<size_t>(n); ++round) {
    for (const auto& g : groups) {
      if (round < g.size()) ring.push_back(g[round]);
    }
  }
  return ring;
}

std::vector<std::vector<int>> PlaceReplicas(const std::vector<std::string>& racks, int k) {
  const int n = static_cast<int>(racks.size());
  const std::vector<int> ring = RackRing(racks);
  std::vector<std::vector<int>> holders(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    for (int j = 1; j <= k && j < n; ++j)
      holders[static_cast<size_t>(ring[static_cast<size_t>(p)])].push_back(ring[static_cast<size_t>((p + j) % n)]);
  }
  return holders;
}

std::vector<std::vector<int>> PlaceErasureGroups(const std::vector<std::string>& racks, int size) {
  const std::vector<int> ring = RackRing(racks);
  std::vector<std::vector<int>> groups;
  for (size_t at = 0; size > 0 && at + static_cast<size_t>(size) <= ring.size(); at += static_cast<size_t>(size)) {
    groups.emplace_back(ring.begin() + static_cast<std::ptrdiff_t>(at),
                        ring.begin() + static_cast<std::ptrdiff_t>(at) + size);
  }
  return groups;
}

}  // namespace ftrun
