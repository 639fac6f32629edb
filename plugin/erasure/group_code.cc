#include "plugin/erasure/group_code.h"

#include <cstring>
#include <string>

namespace ftrun {

Status GroupCode::Create(int data, int parity, std::unique_ptr<GroupCode>* out) {
  std::unique_ptr<ReedSolomon> rs;
  FTRUN_RETURN_IF_ERROR(ReedSolomon::Create(data, parity, &rs));
  out->reset(new GroupCode(std::move(rs)));
  return Status::Ok();
}

GroupCode::GroupCode(std::unique_ptr<ReedSolomon> rs)
    : rs_(std::move(rs)), stripes_(StripeLayout(rs_->data(), rs_->parity())) {
  // A member holds parity row i of exactly one stripe (stripe_layout.h):
  // its slot i.
  parity_of_.assign(static_cast<size_t>(members()), std::vector<int>(static_cast<size_t>(parity()), -1));
  for (size_t j = 0; j < stripes_.size(); ++j) {
    for (size_t i = 0; i < stripes_[j].parity.size(); ++i)
      parity_of_[static_cast<size_t>(stripes_[j].parity[i])][i] = static_cast<int>(j);
  }
}

const uint8_t* GroupCode::SliceOf(const ConstBytes& shard, int s, size_t slice, std::vector<uint8_t>* pad) const {
  const size_t at = static_cast<size_t>(s) * slice;
  if (at + slice <= shard.size) return shard.data + at;  // whole: read in place
  pad->assign(slice, 0);
  if (at < shard.size) std::memcpy(pad->data(), shard.data + at, shard.size - at);
  return pad->data();
}

Status GroupCode::Encode(const std::vector<ConstBytes>& shards, size_t slice,
                         const std::vector<std::vector<uint8_t*>>& parity) const {
  const size_t n = static_cast<size_t>(members());
  if (shards.size() != n || parity.size() != n) {
    return Status::InvalidArgument("erasure encode: expected " + std::to_string(n) + " members, got " +
                                   std::to_string(shards.size()) + " shards and " + std::to_string(parity.size()) +
                                   " parity lists");
  }
  for (size_t m = 0; m < n; ++m) {
    if (shards[m].size > static_cast<size_t>(data()) * slice) {
      return Status::InvalidArgument("erasure encode: member " + std::to_string(m) + "'s shard (" +
                                     std::to_string(shards[m].size) + " bytes) is longer than " +
                                     std::to_string(data()) + " slices of " + std::to_string(slice));
    }
  }
  for (size_t m = 0; m < n; ++m) {
    if (parity[m].size() != parity_of_[m].size()) {
      return Status::InvalidArgument("erasure encode: member " + std::to_string(m) + " holds " +
                                     std::to_string(parity_of_[m].size()) + " parity slices, got " +
                                     std::to_string(parity[m].size()) + " buffers");
    }
  }
  std::vector<std::vector<uint8_t>> pads(static_cast<size_t>(data()));
  for (size_t j = 0; j < stripes_.size(); ++j) {
    const Stripe& s = stripes_[j];
    std::vector<const uint8_t*> in;
    for (size_t f = 0; f < s.data.size(); ++f) {
      in.push_back(SliceOf(shards[static_cast<size_t>(s.data[f].member)], s.data[f].slice, slice, &pads[f]));
    }
    std::vector<uint8_t*> out;
    for (size_t i = 0; i < s.parity.size(); ++i) out.push_back(parity[static_cast<size_t>(s.parity[i])][i]);
    rs_->Encode(slice, in.data(), out.data());
  }
  return Status::Ok();
}

GroupCode::Place GroupCode::Locate(int member, size_t offset, size_t slice) const {
  const int s = static_cast<int>(offset / slice);
  // Member m gives slice t to stripe m - parity - t (mod n) as its fragment t (stripe_layout.h).
  const int n = members();
  Place p;
  p.stripe = ((member - parity() - s) % n + n) % n;
  p.fragment = s;
  p.offset = offset % slice;
  return p;
}

void GroupCode::ApplyDelta(const Place& at, int parity_row, const uint8_t* delta, size_t len, uint8_t* out) const {
  rs_->UpdateRow(len, at.fragment, parity_row, delta, out);
}

Status GroupCode::Rebuild(const std::vector<int>& lost, const std::vector<ConstBytes>& shards,
                          const std::vector<std::vector<const uint8_t*>>& held, size_t slice,
                          const std::vector<uint8_t*>& shard_out,
                          const std::vector<std::vector<uint8_t*>>& parity_out) const {
  const int n = members();
  auto bad = [](const std::string& what) { return Status::InvalidArgument("erasure rebuild: " + what); };
  if (static_cast<int>(lost.size()) > parity()) {
    return bad(std::to_string(lost.size()) + " members lost: the code rebuilds at most " + std::to_string(parity()));
  }
  if (shards.size() != static_cast<size_t>(n) || held.size() != static_cast<size_t>(n) ||
      shard_out.size() != lost.size() || parity_out.size() != lost.size()) {
    return bad("expected " + std::to_string(n) + " members' shards and parity, and outputs for each lost member");
  }
  std::vector<int> index_of(static_cast<size_t>(n), -1);  // member -> its place in `lost`
  for (size_t l = 0; l < lost.size(); ++l) {
    const int m = lost[l];
    if (m < 0 || m >= n) return bad("member " + std::to_string(m) + " out of 0.." + std::to_string(n - 1));
    if (index_of[static_cast<size_t>(m)] >= 0) return bad("member " + std::to_string(m) + " lost twice");
    if (parity_out[l].size() != parity_of_[static_cast<size_t>(m)].size()) {
      return bad("member " + std::to_string(m) + " holds " + std::to_string(parity_of_[static_cast<size_t>(m)].size()) +
                 " parity slices, got " + std::to_string(parity_out[l].size()) + " buffers");
    }
    index_of[static_cast<size_t>(m)] = static_cast<int>(l);
  }
  for (int m = 0; m < n; ++m) {
    if (index_of[static_cast<size_t>(m)] < 0 &&
        held[static_cast<size_t>(m)].size() != parity_of_[static_cast<size_t>(m)].size())
      return bad("surviving member " + std::to_string(m) + ": expected its " +
                 std::to_string(parity_of_[static_cast<size_t>(m)].size()) + " parity slices");
  }
  std::vector<std::vector<uint8_t>> pads(static_cast<size_t>(data()));
  for (size_t j = 0; j < stripes_.size(); ++j) {
    const Stripe& s = stripes_[j];
    std::vector<int> have, miss;
    std::vector<const uint8_t*> in;
    std::vector<uint8_t*> out;
    for (int f = 0; f < n; ++f) {
      const int m = s.MemberOf(f);
      const size_t row = static_cast<size_t>(f - data());  // (parity fragments: the holder's slot)
      const int l = index_of[static_cast<size_t>(m)];
      if (l >= 0) {
        miss.push_back(f);
        out.push_back(f < data() ? shard_out[static_cast<size_t>(l)] +
                                       static_cast<size_t>(s.data[static_cast<size_t>(f)].slice) * slice
                                 : parity_out[static_cast<size_t>(l)][row]);
      } else if (static_cast<int>(have.size()) < data()) {
        have.push_back(f);
        in.push_back(f < data() ? SliceOf(shards[static_cast<size_t>(m)], s.data[static_cast<size_t>(f)].slice, slice,
                                          &pads[have.size() - 1])
                                : held[static_cast<size_t>(m)][row]);
      }
    }
    if (!miss.empty()) FTRUN_RETURN_IF_ERROR(rs_->Decode(slice, have, in.data(), miss, out.data()));
  }
  return Status::Ok();
}

}  // namespace ftrun
