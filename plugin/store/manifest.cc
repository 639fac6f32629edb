#include "plugin/store/manifest.h"

#include <unordered_set>

namespace ftrun {
namespace {

constexpr uint32_t kMaxDims = 64;

Status CheckTensor(const TensorManifest& t, const std::string& what) {
  const std::string where = what + ": tensor '" + t.info.name + "'";
  if (t.info.name.empty()) return Status::InvalidArgument(what + ": a tensor has an empty name");
  uint64_t bytes = DTypeSize(t.info.dtype);
  for (int64_t d : t.info.shape) {
    if (d < 0)
      return Status::InvalidArgument(where + " has a negative dimension in shape " + ShapeString(t.info.shape));
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return Status::InvalidArgument(where + ": shape " + ShapeString(t.info.shape) + " overflows 64 bits");
    }
  }
  if (bytes != t.info.nbytes) {
    return Status::InvalidArgument(where + ": shape " + ShapeString(t.info.shape) + " of " + DTypeName(t.info.dtype) +
                                   " is " + std::to_string(bytes) + " bytes, but " + std::to_string(t.info.nbytes) +
                                   " were given");
  }
  uint64_t sum = 0;
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    Status s = CheckChunkLength(what, t, i, kMaxChunkSize);
    if (!s.ok()) return Status::Corruption(s.message());
    if (__builtin_add_overflow(sum, t.chunks[i].length, &sum)) {
      return Status::Corruption(where + ": chunk lengths overflow");
    }
  }
  if (sum != t.info.nbytes) {
    return Status::Corruption(where + ": chunks hold " + std::to_string(sum) + " bytes, expected " +
                              std::to_string(t.info.nbytes));
  }
  return Status::Ok();
}

}  // namespace

Status CheckChunkLength(const std::string& where, const TensorManifest& t, size_t chunk, uint64_t max) {
  const uint64_t length = t.chunks[chunk].length;
  if (length >= 1 && length <= max) return Status::Ok();
  return Status::InvalidArgument(where + ": tensor '" + t.info.name + "' chunk #" + std::to_string(chunk) +
                                 " field 'length' is " + std::to_string(length) + " bytes; a chunk is 1.." +
                                 std::to_string(max) + " bytes");
}

uint64_t Manifest::state_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.info.nbytes;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

void EncodeManifest(const Manifest& m, ByteWriter* w) {
  w->Put<int32_t>(m.rank);
  w->Put<uint64_t>(m.version);
  w->PutString(m.user_bytes);
  w->Put<uint32_t>(static_cast<uint32_t>(m.tensors.size()));
  for (const auto& t : m.tensors) {
    w->PutString(t.info.name);
    w->Put<uint8_t>(static_cast<uint8_t>(t.info.dtype));
    w->Put<uint8_t>(static_cast<uint8_t>(t.info.device));
    w->Put<uint32_t>(static_cast<uint32_t>(t.info.shape.size()));
    for (int64_t d : t.info.shape) w->Put<int64_t>(d);
    w->Put<uint64_t>(t.info.nbytes);
    w->Put<uint32_t>(static_cast<uint32_t>(t.chunks.size()));
    for (const auto& c : t.chunks) {
      w->Put<uint64_t>(c.hash.lo);
      w->Put<uint64_t>(c.hash.hi);
      w->Put<uint64_t>(c.length);
      w->Put<uint64_t>(c.offset);
    }
  }
}

Status DecodeManifest(ByteReader* r, const std::string& what, Manifest* out) {
  Manifest m;
  m.rank = r->Get<int32_t>();
  m.version = r->Get<uint64_t>();
  m.user_bytes = r->GetString();
  uint32_t nt = r->GetCount(4 + 1 + 1 + 4 + 8 + 4);
  m.tensors.resize(nt);
  std::unordered_set<std::string> names;
  for (auto& t : m.tensors) {
    t.info.name = r->GetString();
    uint8_t dtype = r->Get<uint8_t>();
    uint8_t device = r->Get<uint8_t>();
    if (dtype > static_cast<uint8_t>(DType::kUInt64) || device > 1) {
      return Status::Corruption(what + ": tensor '" + t.info.name + "' has an unknown dtype or device code");
    }
    t.info.dtype = static_cast<DType>(dtype);
    t.info.device = static_cast<Device>(device);
    uint32_t nd = r->GetCount(8);
    if (nd > kMaxDims)
      return Status::InvalidArgument(what + ": tensor '" + t.info.name + "' has more than 64 dimensions");
    t.info.shape.resize(nd);
    for (auto& d : t.info.shape) d = r->Get<int64_t>();
    t.info.nbytes = r->Get<uint64_t>();
    uint32_t nc = r->GetCount(32);
    t.chunks.resize(nc);
    for (auto& c : t.chunks) {
      c.hash.lo = r->Get<uint64_t>();
      c.hash.hi = r->Get<uint64_t>();
      c.length = r->Get<uint64_t>();
      c.offset = r->Get<uint64_t>();
    }
    if (!r->ok()) break;
    if (!names.insert(t.info.name).second) {
      return Status::InvalidArgument(what + ": tensor name '" + t.info.name + "' appears twice");
    }
    FTRUN_RETURN_IF_ERROR(CheckTensor(t, what));
  }
  if (!r->ok()) return Status::Corruption(what + ": truncated or malformed manifest");
  *out = std::move(m);
  return Status::Ok();
}

Status CheckSameLayout(const Manifest& before, const Manifest& after) {
  const std::string who = "rank " + std::to_string(after.rank) + " version " + std::to_string(after.version);
  const std::string was = " than at version " + std::to_string(before.version);
  size_t n = std::min(before.tensors.size(), after.tensors.size());
  for (size_t i = 0; i < n; ++i) {
    const TensorInfo& a = before.tensors[i].info;
    const TensorInfo& b = after.tensors[i].info;
    if (a.name != b.name) {
      return Status::FailedPrecondition(who + " saves tensor #" + std::to_string(i) + " as '" + b.name + "', it was '" +
                                        a.name + "' at version " + std::to_string(before.version) +
                                        " (a rank must save the same tensors every time)");
    }
    if (a.dtype != b.dtype || a.shape != b.shape) {
      return Status::FailedPrecondition(who + " saves tensor '" + b.name + "' as " + DTypeName(b.dtype) +
                                        ShapeString(b.shape) + ", it was " + DTypeName(a.dtype) + ShapeString(a.shape) +
                                        " at version " + std::to_string(before.version));
    }
  }
  if (before.tensors.size() != after.tensors.size()) {
    const auto& longer = before.tensors.size() > after.tensors.size() ? before : after;
    return Status::FailedPrecondition(who + " saves " + std::to_string(after.tensors.size()) + " tensors, " +
                                      std::to_string(before.tensors.size()) + was + " (first difference: '" +
                                      longer.tensors[n].info.name + "')");
  }
  return Status::Ok();
}

}  // namespace ftrun
