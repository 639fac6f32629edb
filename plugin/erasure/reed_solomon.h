// ReedSolomon: a systematic Reed-Solomon code over GF(2^8) of `data` data
// fragments and `parity` parity fragments, every fragment the same length;
// any `parity` lost fragments are rebuilt from any `data` others. All field
// arithmetic is ISA-L's (a Cauchy generator matrix, whose every square
// submatrix is invertible: gf_gen_cauchy1_matrix; ec_init_tables,
// ec_encode_data, ec_encode_data_update, gf_invert_matrix).
//
// Fragments are numbered 0 .. data-1 (the data, unchanged by the code) and
// data .. data+parity-1 (the parity).
//
// Incremental: the code is linear, so when data fragment i changes from old
// to new, every parity fragment changes by the product of its coefficient
// and (old XOR new). Update() applies such a delta to parity in place: a
// parity holder that receives the changed chunks' deltas re-encodes only
// those bytes, and what crosses the wire follows the change, as with
// replication (a holder of a copy receives the changed chunks).
//
// Thread-safety: const methods may be called from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

class ReedSolomon {
 public:
  static constexpr int kMaxData = 32;   // a group's data nodes
  static constexpr int kMaxParity = 8;  // its parity nodes

  // InvalidArgument naming the bound when data is not in 1..kMaxData or
  // parity not in 1..kMaxParity.
  static Status Create(int data, int parity, std::unique_ptr<ReedSolomon>* out);

  int data() const { return data_; }
  int parity() const { return parity_; }

  // parity[0..parity-1] = the code of data[0..data-1], each `len` bytes.
  void Encode(size_t len, const uint8_t* const* data, uint8_t* const* parity) const;

  // Data fragment `index` changed by `delta` (its old bytes XOR its new,
  // `len` bytes from the same offset as `parity`): each parity fragment is
  // brought up to date in place. Deltas of different fragments, or of the
  // same one in turn, may be applied in any order.
  void Update(size_t len, int index, const uint8_t* delta, uint8_t* const* parity) const;
  // The same for parity fragment `row` alone (0 .. parity-1): what the one
  // member holding it does with a delta it receives.
  void UpdateRow(size_t len, int index, int row, const uint8_t* delta, uint8_t* out) const;

  // Rebuilds the fragments `lost` (their numbers) into out[0..lost.size()-1]
  // from exactly data() others: have[i] is a fragment's number, bufs[i] its
  // bytes. InvalidArgument when `have` is not data() distinct fragments,
  // `lost` names one of them or more than parity() fragments, or a number is
  // out of range.
  Status Decode(size_t len, const std::vector<int>& have, const uint8_t* const* bufs, const std::vector<int>& lost,
                uint8_t* const* out) const;

 private:
  ReedSolomon(int data, int parity);

  const int data_, parity_;
  std::vector<uint8_t> matrix_;                   // (data + parity) x data; the top data rows are the identity
  std::vector<uint8_t> tables_;                   // ec_init_tables of the parity rows
  std::vector<std::vector<uint8_t>> row_tables_;  // ec_init_tables of each parity row alone (UpdateRow)
};

}  // namespace ftrun
