#include "plugin/erasure/stripe_layout.h"

namespace ftrun {

std::vector<Stripe> StripeLayout(int data, int parity) {
  const int n = data + parity;
  std::vector<Stripe> stripes(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) {
    Stripe& s = stripes[static_cast<std::size_t>(j)];
    for (int i = 0; i < parity; ++i) s.parity.push_back((j + i) % n);
    for (int t = 0; t < data; ++t) s.data.push_back({(j + parity + t) % n, t});
  }
  return stripes;
}

}  // namespace ftrun
