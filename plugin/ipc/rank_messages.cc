#include "plugin/ipc/rank_messages.h"

#include "plugin/common/bytes.h"

namespace ftrun {
namespace {

Status Checked(const ByteReader& r, const char* what) {
  if (r.ok() && r.done()) return Status::Ok();
  return Status::Corruption(std::string("malformed ") + what);
}

}  // namespace

std::string Encode(const RankHello& m) {
  ByteWriter w;
  w.Put<uint32_t>(m.protocol);
  w.Put<int32_t>(m.rank);
  w.Put<int32_t>(m.pid);
  w.PutString(m.job);
  w.Put<uint8_t>(static_cast<uint8_t>(m.role));
  return w.data();
}

Status RankHello::Decode(std::string_view payload, RankHello* out) {
  ByteReader r(payload);
  out->protocol = r.Get<uint32_t>();
  out->rank = r.Get<int32_t>();
  out->pid = r.Get<int32_t>();
  out->job = r.GetString();
  out->role = HelloRole::kRank;
  if (r.ok() && !r.done()) {
    const uint8_t role = r.Get<uint8_t>();
    if (r.ok() && role > static_cast<uint8_t>(HelloRole::kWriter)) {
      return Status::InvalidArgument("hello: role " + std::to_string(role) +
                                     " is neither 0 (the rank) nor 1 (a writer of the rank)");
    }
    out->role = static_cast<HelloRole>(role);
  }
  return Checked(r, "hello");
}

std::string Encode(const HelloOkMsg& m) {
  ByteWriter w;
  w.PutString(m.job_id);
  w.Put<int32_t>(m.node);
  w.Put<uint64_t>(m.chunk_size);
  w.PutOptionalU64(m.restore_version);
  return w.data();
}

Status Decode(std::string_view payload, HelloOkMsg* out) {
  ByteReader r(payload);
  out->job_id = r.GetString();
  out->node = r.Get<int32_t>();
  out->chunk_size = r.Get<uint64_t>();
  out->restore_version = r.GetOptionalU64();
  return Checked(r, "hello reply from the agent");
}

std::string Encode(const SaveOkMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.version);
  w.PutOptionalU64(m.committed);
  return w.data();
}

Status Decode(std::string_view payload, SaveOkMsg* out) {
  ByteReader r(payload);
  out->version = r.Get<uint64_t>();
  out->committed = r.GetOptionalU64();
  return Checked(r, "save reply from the agent");
}

std::string Encode(const VersionMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.version);
  return w.data();
}

Status Decode(std::string_view payload, VersionMsg* out, const char* what) {
  ByteReader r(payload);
  out->version = r.Get<uint64_t>();
  return Checked(r, what);
}

std::string Encode(const CorruptChunkReport& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.version);
  w.PutString(m.tensor);
  w.Put<uint64_t>(m.index);
  w.Put<uint64_t>(m.seen.lo);
  w.Put<uint64_t>(m.seen.hi);
  return w.data();
}

Status CorruptChunkReport::Decode(std::string_view payload, CorruptChunkReport* out) {
  ByteReader r(payload);
  out->version = r.Get<uint64_t>();
  out->tensor = r.GetString();
  out->index = r.Get<uint64_t>();
  out->seen.lo = r.Get<uint64_t>();
  out->seen.hi = r.Get<uint64_t>();
  return Checked(r, "corrupted-chunk report");
}

std::string Encode(const AllocMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.version);
  w.Put<uint8_t>(m.first ? 1 : 0);
  w.PutU64s(m.lengths);
  return w.data();
}

Status Decode(std::string_view payload, AllocMsg* out) {
  ByteReader r(payload);
  out->version = r.Get<uint64_t>();
  out->first = r.Get<uint8_t>() != 0;
  out->lengths = r.GetU64s();
  return Checked(r, "reserve request");
}

std::string Encode(const AllocOkMsg& m) {
  ByteWriter w;
  w.PutU64s(m.offsets);
  return w.data();
}

Status Decode(std::string_view payload, AllocOkMsg* out) {
  ByteReader r(payload);
  out->offsets = r.GetU64s();
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
  w.PutU64s(m.committed);
  w.PutU64s(m.pending);
  w.Put<uint8_t>(m.has_committed ? 1 : 0);
  w.Put<uint64_t>(m.committed_version);
  return w.data();
}

Status Decode(std::string_view payload, ListOkMsg* out) {
  ByteReader r(payload);
  out->committed = r.GetU64s();
  out->pending = r.GetU64s();
  out->has_committed = r.Get<uint8_t>() != 0;
  out->committed_version = r.Get<uint64_t>();
  return Checked(r, "version list from the agent");
}

}  // namespace ftrun
