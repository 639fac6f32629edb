// Encode and Decode of the small cluster messages (cluster_messages.h):
// agents' reports to the coordinator and the coordinator's orders.
#include "plugin/protocol/cluster_messages.h"

namespace ftrun {

Status CheckRead(const ByteReader& r, ClusterMsg type, size_t size) {
  if (r.ok() && r.done()) return Status::Ok();
  return Status::Corruption("malformed " + ClusterMsgName(type) + " message (" + std::to_string(size) + " bytes)");
}

std::string Encode(const RankFailedMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  w.Put<int32_t>(m.code);
  w.PutString(m.reason);
  w.Put<uint8_t>(m.early ? 1 : 0);
  return w.data();
}

Status Decode(const std::string& payload, RankFailedMsg* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->code = r.Get<int32_t>();
  m->reason = r.GetString();
  m->early = r.Get<uint8_t>() != 0;
  return CheckRead(r, RankFailedMsg::kType, payload.size());
}

std::string Encode(const FatalMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  w.PutString(m.message);
  w.Put<int32_t>(m.code);
  return w.data();
}

Status Decode(const std::string& payload, FatalMsg* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->message = r.GetString();
  m->code = r.Get<int32_t>();
  return CheckRead(r, FatalMsg::kType, payload.size());
}

std::string Encode(const DroppedMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  PutRankVersions(m.items, &w);
  w.PutString(m.why);
  return w.data();
}

Status Decode(const std::string& payload, DroppedMsg* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->items = GetRankVersions(&r);
  m->why = r.GetString();
  return CheckRead(r, DroppedMsg::kType, payload.size());
}

std::string Encode(const PullFailedMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  w.Put<int32_t>(m.rank);
  w.Put<uint64_t>(m.version);
  w.PutString(m.message);
  return w.data();
}

Status Decode(const std::string& payload, PullFailedMsg* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->rank = r.Get<int32_t>();
  m->version = r.Get<uint64_t>();
  m->message = r.GetString();
  return CheckRead(r, PullFailedMsg::kType, payload.size());
}

std::string Encode(const DiskFailedMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  w.Put<uint64_t>(m.version);
  w.PutString(m.message);
  return w.data();
}

Status Decode(const std::string& payload, DiskFailedMsg* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->version = r.Get<uint64_t>();
  m->message = r.GetString();
  return CheckRead(r, DiskFailedMsg::kType, payload.size());
}

std::string Encode(const CommitMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.version);
  w.Put<uint64_t>(m.epoch);
  return w.data();
}

Status Decode(const std::string& payload, CommitMsg* m) {
  ByteReader r(payload);
  m->version = r.Get<uint64_t>();
  m->epoch = r.Get<uint64_t>();
  return CheckRead(r, CommitMsg::kType, payload.size());
}

std::string Encode(const StopMsg& m) {
  ByteWriter w;
  w.Put<int32_t>(m.code);
  w.PutString(m.message);
  return w.data();
}

Status Decode(const std::string& payload, StopMsg* m) {
  ByteReader r(payload);
  m->code = r.Get<int32_t>();
  m->message = r.GetString();
  return CheckRead(r, StopMsg::kType, payload.size());
}

std::string Encode(const FencedMsg& m) { return m.message; }

Status Decode(const std::string& payload, FencedMsg* m) {
  m->message = payload;
  return Status::Ok();
}

std::string Encode(const DropAboveMsg& m) { return EncodeU64(m.version); }

Status Decode(const std::string& payload, DropAboveMsg* m) {
  ByteReader r(payload);
  m->version = r.Get<uint64_t>();
  return CheckRead(r, DropAboveMsg::kType, payload.size());
}

}  // namespace ftrun
