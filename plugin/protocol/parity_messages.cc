#include "plugin/protocol/parity_messages.h"

namespace ftrun {

uint64_t ParityOfferMsg::bytes() const {
  uint64_t n = 0;
  for (const auto& e : extents) n += e.second;
  return n;
}

std::string Encode(const ParityOfferMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.xfer);
  w.Put<uint64_t>(m.epoch);
  w.Put<uint64_t>(m.version);
  w.Put<uint8_t>(m.base ? 1 : 0);
  w.Put<uint64_t>(m.base.value_or(0));
  w.Put<int32_t>(m.stripe);
  w.Put<int32_t>(m.row);
  w.Put<int32_t>(m.fragment);
  w.Put<uint8_t>(m.last ? 1 : 0);
  w.Put<uint32_t>(static_cast<uint32_t>(m.extents.size()));
  for (const auto& [offset, len] : m.extents) {
    w.Put<uint64_t>(offset);
    w.Put<uint64_t>(len);
  }
  return w.Take();
}

Status Decode(const std::string& payload, ParityOfferMsg* m) {
  ByteReader r(payload);
  m->xfer = r.Get<uint64_t>();
  m->epoch = r.Get<uint64_t>();
  m->version = r.Get<uint64_t>();
  const bool has_base = r.Get<uint8_t>() != 0;
  const uint64_t base = r.Get<uint64_t>();
  m->base = has_base ? std::optional<uint64_t>(base) : std::nullopt;
  m->stripe = r.Get<int32_t>();
  m->row = r.Get<int32_t>();
  m->fragment = r.Get<int32_t>();
  m->last = r.Get<uint8_t>() != 0;
  m->extents.resize(r.GetCount(16));
  uint64_t end = 0, total = 0;
  for (auto& [offset, len] : m->extents) {
    offset = r.Get<uint64_t>();
    len = r.Get<uint64_t>();
    if (!r.ok()) break;
    if (len == 0 || offset < end || __builtin_add_overflow(offset, len, &end) ||
        __builtin_add_overflow(total, len, &total) || total > ParityOfferMsg::kMaxBytes) {
      return Status::Corruption("parity offer " + std::to_string(m->xfer) + ": extent (" + std::to_string(offset) +
                                ", " + std::to_string(len) + ") is empty, out of order, or past " +
                                std::to_string(ParityOfferMsg::kMaxBytes) + " bytes in all");
    }
  }
  return CheckRead(r, ParityOfferMsg::kType, payload.size());
}

std::string Encode(const ParityWantMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.xfer);
  w.Put<uint64_t>(m.tag);
  return w.Take();
}

Status Decode(const std::string& payload, ParityWantMsg* m) {
  ByteReader r(payload);
  m->xfer = r.Get<uint64_t>();
  m->tag = r.Get<uint64_t>();
  return CheckRead(r, ParityWantMsg::kType, payload.size());
}

std::string Encode(const ParityRefusedMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.xfer);
  w.Put<uint8_t>(m.need_full ? 1 : 0);
  w.PutString(m.message);
  return w.Take();
}

Status Decode(const std::string& payload, ParityRefusedMsg* m) {
  ByteReader r(payload);
  m->xfer = r.Get<uint64_t>();
  m->need_full = r.Get<uint8_t>() != 0;
  m->message = r.GetString();
  return CheckRead(r, ParityRefusedMsg::kType, payload.size());
}

std::string Encode(const ParityAppliedMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.xfer);
  return w.Take();
}

Status Decode(const std::string& payload, ParityAppliedMsg* m) {
  ByteReader r(payload);
  m->xfer = r.Get<uint64_t>();
  return CheckRead(r, ParityAppliedMsg::kType, payload.size());
}

}  // namespace ftrun

namespace ftrun {
namespace {

// At most this many manifests in one message (a node's ranks).
constexpr uint32_t kMaxManifests = 4096;

void PutManifests(const std::vector<Manifest>& v, ByteWriter* w) {
  w->Put<uint32_t>(static_cast<uint32_t>(v.size()));
  for (const Manifest& m : v) EncodeManifest(m, w);
}

Status GetManifests(ByteReader* r, const std::string& what, std::vector<Manifest>* out) {
  const uint32_t n = r->GetCount(8);
  if (n > kMaxManifests) return Status::Corruption(what + ": " + std::to_string(n) + " manifests");
  out->resize(n);
  for (Manifest& m : *out) {
    if (!r->ok()) break;
    FTRUN_RETURN_IF_ERROR(DecodeManifest(r, what, &m));
  }
  return Status::Ok();
}

}  // namespace

std::string Encode(const GroupManifestsMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  w.Put<uint64_t>(m.version);
  PutManifests(m.manifests, &w);
  return w.Take();
}

Status Decode(const std::string& payload, GroupManifestsMsg* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->version = r.Get<uint64_t>();
  FTRUN_RETURN_IF_ERROR(GetManifests(&r, "group manifests", &m->manifests));
  return CheckRead(r, GroupManifestsMsg::kType, payload.size());
}

std::string Encode(const FragmentRequestMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.xfer);
  w.Put<uint64_t>(m.epoch);
  w.Put<uint64_t>(m.version);
  w.Put<uint8_t>(m.kind);
  w.Put<int32_t>(m.index);
  w.Put<uint64_t>(m.offset);
  w.Put<uint64_t>(m.length);
  w.Put<uint64_t>(m.tag);
  return w.Take();
}

Status Decode(const std::string& payload, FragmentRequestMsg* m) {
  ByteReader r(payload);
  m->xfer = r.Get<uint64_t>();
  m->epoch = r.Get<uint64_t>();
  m->version = r.Get<uint64_t>();
  m->kind = r.Get<uint8_t>();
  m->index = r.Get<int32_t>();
  m->offset = r.Get<uint64_t>();
  m->length = r.Get<uint64_t>();
  m->tag = r.Get<uint64_t>();
  if (r.ok() && (m->kind > FragmentRequestMsg::kManifests || m->index < 0 || m->length > kMaxParityRowBytes ||
                 m->offset > kMaxParityRowBytes)) {
    return Status::Corruption("fragment request " + std::to_string(m->xfer) + ": kind " + std::to_string(m->kind) +
                              ", index " + std::to_string(m->index) + ", " + std::to_string(m->length) + " bytes at " +
                              std::to_string(m->offset) + " out of range");
  }
  return CheckRead(r, FragmentRequestMsg::kType, payload.size());
}

std::string Encode(const FragmentRefusedMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.xfer);
  w.PutString(m.message);
  return w.Take();
}

Status Decode(const std::string& payload, FragmentRefusedMsg* m) {
  ByteReader r(payload);
  m->xfer = r.Get<uint64_t>();
  m->message = r.GetString();
  return CheckRead(r, FragmentRefusedMsg::kType, payload.size());
}

std::string Encode(const FragmentManifestsMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.xfer);
  PutManifests(m.manifests, &w);
  return w.Take();
}

Status Decode(const std::string& payload, FragmentManifestsMsg* m) {
  ByteReader r(payload);
  m->xfer = r.Get<uint64_t>();
  FTRUN_RETURN_IF_ERROR(GetManifests(&r, "fragment manifests", &m->manifests));
  return CheckRead(r, FragmentManifestsMsg::kType, payload.size());
}

}  // namespace ftrun
