#include "plugin/ipc/rank_messages.h"

#include "plugin/common/bytes.h"

namespace ftrun {
namespace {

void PutU64s(const std::vector<uint64_t>& v, ByteWriter* w) {
  w->Put<uint32_t>(static_cast<uint32_t>(v.size()));
  for (uint64_t x : v) w->Put<uint64_t>(x);
}

std::vector<uint64_t> GetU64s(ByteReader* r) {
  std::vector<uint64_t> v(r->GetCount(8));
  for (uint64_t& x : v) x = r->Get<uint64_t>();
  return v;
}

Status Checked(const ByteReader& r, const char* what) {
  if (r.ok() && r.done()) return Status::Ok();
  return Status::Corruption(std::string("malformed ") + what);
}

}  // namespace

std::string Encode(const AllocMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.version);
  w.Put<uint8_t>(m.first ? 1 : 0);
  PutU64s(m.lengths, &w);
  return w.data();
}

Status Decode(std::string_view payload, AllocMsg* out) {
  ByteReader r(payload);
  out->version = r.Get<uint64_t>();
  out->first = r.Get<uint8_t>() != 0;
  out->lengths = GetU64s(&r);
  return Checked(r, "reserve request");
}

std::string Encode(const AllocOkMsg& m) {
  ByteWriter w;
  PutU64s(m.offsets, &w);
  return w.data();
}

Status Decode(std::string_view payload, AllocOkMsg* out) {
  ByteReader r(payload);
  out->offsets = GetU64s(&r);
  return Checked(r, "reservation from the agent");
}

std::string Encode(const WaitCommittedMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.version);
  w.Put<int32_t>(m.timeout_ms);
  return w.data();
}

Status Decode(std::string_view payload, WaitCommittedMsg* out) {
  ByteReader r(payload);
  out->version = r.Get<uint64_t>();
  out->timeout_ms = r.Get<int32_t>();
  return Checked(r, "wait request");
}

std::string Encode(const ListOkMsg& m) {
  ByteWriter w;
  PutU64s(m.committed, &w);
  PutU64s(m.pending, &w);
  w.Put<uint8_t>(m.has_committed ? 1 : 0);
  w.Put<uint64_t>(m.committed_version);
  return w.data();
}

Status Decode(std::string_view payload, ListOkMsg* out) {
  ByteReader r(payload);
  out->committed = GetU64s(&r);
  out->pending = GetU64s(&r);
  out->has_committed = r.Get<uint8_t>() != 0;
  out->committed_version = r.Get<uint64_t>();
  return Checked(r, "version list from the agent");
}

}  // namespace ftrun
