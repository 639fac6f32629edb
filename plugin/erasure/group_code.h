// GroupCode: an erasure-coded group's parity, computed from its members'
// shards, and its lost members rebuilt (shard and held parity) from the
// survivors: StripeLayout's stripes through ReedSolomon. What the agents of
// a group hold and what a replacement pulls and decodes; memory in, memory
// out (the store and the transport are the caller's).
//
// Slices are SliceLength(...) bytes; a slice past a shard's end reads as
// zeros, so shards of different lengths (ranks with different state sizes)
// share one layout. Every member holds parity() parity slices: in its
// slot i, parity row i (fragment data() + i) of stripe
// ParityStripes(member)[i].
//
// Thread-safety: const methods may be called from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ftrun/status.h"
#include "plugin/erasure/reed_solomon.h"
#include "plugin/erasure/stripe_layout.h"

namespace ftrun {

struct ConstBytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

class GroupCode {
 public:
  static Status Create(int data, int parity, std::unique_ptr<GroupCode>* out);

  int data() const { return rs_->data(); }
  int parity() const { return rs_->parity(); }
  int members() const { return data() + parity(); }
  const std::vector<Stripe>& stripes() const { return stripes_; }
  // The stripes whose parity `member` holds: [i] is the one whose row i it
  // holds (each member holds each row of exactly one stripe).
  const std::vector<int>& ParityStripes(int member) const { return parity_of_[static_cast<size_t>(member)]; }
  // The slice length for a group whose longest shard is `longest` bytes.
  size_t SliceLength(size_t longest) const { return (longest + static_cast<size_t>(data()) - 1) / data(); }

  // parity[m][i]: where member m's i-th parity slice goes (`slice` bytes
  // each, ParityStripes(m)[i]'s). shards[m]: member m's shard, at most
  // data() * slice bytes.
  Status Encode(const std::vector<ConstBytes>& shards, size_t slice,
                const std::vector<std::vector<uint8_t*>>& parity) const;

  // Where byte `offset` of `member`'s shard is coded: its stripe, its
  // fragment there (a data fragment), and the offset in that slice.
  struct Place {
    int stripe = 0, fragment = 0;
    size_t offset = 0;
  };
  Place Locate(int member, size_t offset, size_t slice) const;

  // Bytes [offset, offset + len) of `member`'s shard changed by `delta` (old
  // XOR new; the range within one slice): parity row `parity_row`
  // (0 .. parity()-1) of its stripe, which stripes()[stripe].parity[row]
  // holds in its slot `parity_row`, is brought up to date in place at `out`
  // (that slice's bytes at the same offset). What a parity holder does with
  // each delta it receives.
  void ApplyDelta(const Place& at, int parity_row, const uint8_t* delta, size_t len, uint8_t* out) const;

  // One fragment of a stripe, `lost`, from exactly data() others (`have`:
  // their numbers, bufs: their bytes), `len` bytes of each: what a
  // replacement decodes slice by slice (ReedSolomon::Decode).
  Status DecodeFragment(size_t len, const std::vector<int>& have, const uint8_t* const* bufs, int lost,
                        uint8_t* out) const {
    uint8_t* outs[] = {out};
    return rs_->Decode(len, have, bufs, {lost}, outs);
  }

  // Rebuilds the `lost` members (at most parity() of them) from the others:
  // shards[m] and held[m][i] (its parity slices) for every member not lost.
  // Writes each lost member's shard into shard_out[l] (data() * slice bytes:
  // its length is the caller's to know) and its parity slices into
  // parity_out[l][i].
  Status Rebuild(const std::vector<int>& lost, const std::vector<ConstBytes>& shards,
                 const std::vector<std::vector<const uint8_t*>>& held, size_t slice,
                 const std::vector<uint8_t*>& shard_out, const std::vector<std::vector<uint8_t*>>& parity_out) const;

 private:
  explicit GroupCode(std::unique_ptr<ReedSolomon> rs);
  // Slice s of `shard`, zero-padded where it runs past the end (into `pad`).
  const uint8_t* SliceOf(const ConstBytes& shard, int s, size_t slice, std::vector<uint8_t>* pad) const;

  std::unique_ptr<ReedSolomon> rs_;
  std::vector<Stripe> stripes_;
  std::vector<std::vector<int>> parity_of_;  // member -> stripes it holds parity of
};

}  // namespace ftrun
