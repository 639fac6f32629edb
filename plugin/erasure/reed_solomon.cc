#include "plugin/erasure/reed_solomon.h"

#include <isa-l/erasure_code.h>

#include <algorithm>
#include <climits>
#include <string>

namespace ftrun {

namespace {

// ISA-L takes lengths as int: longer buffers go in pieces.
constexpr size_t kPiece = size_t{1} << 30;

std::vector<uint8_t*> Offset(const uint8_t* const* bufs, size_t n, size_t at) {
  std::vector<uint8_t*> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = const_cast<uint8_t*>(bufs[i]) + at;
  return v;
}

}  // namespace

Status ReedSolomon::Create(int data, int parity, std::unique_ptr<ReedSolomon>* out) {
  if (data < 1 || data > kMaxData) {
    return Status::InvalidArgument("data fragments: expected 1 to " + std::to_string(kMaxData) + ", got " +
                                   std::to_string(data));
  }
  if (parity < 1 || parity > kMaxParity) {
    return Status::InvalidArgument("parity fragments: expected 1 to " + std::to_string(kMaxParity) + ", got " +
                                   std::to_string(parity));
  }
  out->reset(new ReedSolomon(data, parity));
  return Status::Ok();
}

ReedSolomon::ReedSolomon(int data, int parity)
    : data_(data),
      parity_(parity),
      matrix_(static_cast<size_t>((data + parity) * data)),
      tables_(static_cast<size_t>(32 * data * parity)),
      row_tables_(static_cast<size_t>(parity), std::vector<uint8_t>(static_cast<size_t>(32 * data))) {
  gf_gen_cauchy1_matrix(matrix_.data(), data + parity, data);
  ec_init_tables(data, parity, matrix_.data() + static_cast<size_t>(data * data), tables_.data());
  // Each row's own tables: the layout of ec_init_tables' output is ISA-L's
  // choice (from 2.31, GFNI's where the CPU has it), so a row's part cannot
  // be found by offset into tables_.
  for (int row = 0; row < parity; ++row) {
    ec_init_tables(data, 1, matrix_.data() + static_cast<size_t>((data + row) * data),
                   row_tables_[static_cast<size_t>(row)].data());
  }
}

void ReedSolomon::Encode(size_t len, const uint8_t* const* data, uint8_t* const* parity) const {
  for (size_t at = 0; at < len; at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, len - at));
    auto in = Offset(data, static_cast<size_t>(data_), at);
    auto out = Offset(parity, static_cast<size_t>(parity_), at);
    ec_encode_data(n, data_, parity_, const_cast<uint8_t*>(tables_.data()), in.data(), out.data());
  }
}

void ReedSolomon::Update(size_t len, int index, const uint8_t* delta, uint8_t* const* parity) const {
  for (size_t at = 0; at < len; at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, len - at));
    auto out = Offset(parity, static_cast<size_t>(parity_), at);
    ec_encode_data_update(n, data_, parity_, index, const_cast<uint8_t*>(tables_.data()),
                          const_cast<uint8_t*>(delta) + at, out.data());
  }
}

void ReedSolomon::UpdateRow(size_t len, int index, int row, const uint8_t* delta, uint8_t* out) const {
  uint8_t* tables = const_cast<uint8_t*>(row_tables_[static_cast<size_t>(row)].data());
  for (size_t at = 0; at < len; at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, len - at));
    uint8_t* o = out + at;
    ec_encode_data_update(n, data_, 1, index, tables, const_cast<uint8_t*>(delta) + at, &o);
  }
}

Status ReedSolomon::Decode(size_t len, const std::vector<int>& have, const uint8_t* const* bufs,
                           const std::vector<int>& lost, uint8_t* const* out) const {
  const int total = data_ + parity_;
  auto bad = [](const std::string& what) { return Status::InvalidArgument("erasure decode: " + what); };
  if (static_cast<int>(have.size()) != data_) {
    return bad("expected " + std::to_string(data_) + " surviving fragments, got " + std::to_string(have.size()));
  }
  if (static_cast<int>(lost.size()) > parity_) {
    return bad(std::to_string(lost.size()) + " lost fragments: the code rebuilds at most " + std::to_string(parity_));
  }
  std::vector<bool> seen(static_cast<size_t>(total), false);
  for (int f : have) {
    if (f < 0 || f >= total) return bad("fragment " + std::to_string(f) + " out of 0.." + std::to_string(total - 1));
    if (seen[static_cast<size_t>(f)]) return bad("fragment " + std::to_string(f) + " given twice");
    seen[static_cast<size_t>(f)] = true;
  }
  for (int f : lost) {
    if (f < 0 || f >= total) return bad("fragment " + std::to_string(f) + " out of 0.." + std::to_string(total - 1));
    if (seen[static_cast<size_t>(f)]) return bad("fragment " + std::to_string(f) + " is both had and lost");
  }
  if (lost.empty()) return Status::Ok();
  const size_t k = static_cast<size_t>(data_);
  // The survivors' rows of the generator, inverted: data = inverse x survivors.
  std::vector<uint8_t> rows(k * k), inverse(k * k);
  for (size_t i = 0; i < k; ++i) {
    std::copy_n(matrix_.data() + static_cast<size_t>(have[i]) * k, k, rows.data() + i * k);
  }
  if (gf_invert_matrix(rows.data(), inverse.data(), data_) != 0) {
    return bad("the surviving fragments' rows are singular");  // never with a Cauchy matrix
  }
  // Each lost fragment's row over the survivors: a data fragment's is its
  // row of the inverse; a parity fragment's is its generator row x inverse.
  std::vector<uint8_t> decode(lost.size() * k, 0);
  for (size_t l = 0; l < lost.size(); ++l) {
    const size_t f = static_cast<size_t>(lost[l]);
    uint8_t* row = decode.data() + l * k;
    if (f < k) {
      std::copy_n(inverse.data() + f * k, k, row);
      continue;
    }
    for (size_t c = 0; c < k; ++c) {
      uint8_t acc = 0;
      for (size_t j = 0; j < k; ++j) acc ^= gf_mul(matrix_[f * k + j], inverse[j * k + c]);
      row[c] = acc;
    }
  }
  std::vector<uint8_t> tables(32 * k * lost.size());
  ec_init_tables(data_, static_cast<int>(lost.size()), decode.data(), tables.data());
  for (size_t at = 0; at < len; at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, len - at));
    auto in = Offset(bufs, k, at);
    auto o = Offset(out, lost.size(), at);
    ec_encode_data(n, data_, static_cast<int>(lost.size()), tables.data(), in.data(), o.data());
  }
  return Status::Ok();
}

}  // namespace ftrun
