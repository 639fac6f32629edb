#include "plugin/protocol/cluster_messages.h"

namespace ftrun {

std::string EncodeU64(uint64_t v) {
  ByteWriter w;
  w.Put<uint64_t>(v);
  return w.data();
}

void PutRankVersions(const std::vector<RankVersion>& v, ByteWriter* w) {
  w->Put<uint32_t>(static_cast<uint32_t>(v.size()));
  for (const auto& [rank, version] : v) {
    w->Put<int32_t>(rank);
    w->Put<uint64_t>(version);
  }
}

std::vector<RankVersion> GetRankVersions(ByteReader* r) {
  uint32_t n = r->GetCount(12);
  std::vector<RankVersion> v(n);
  for (auto& [rank, version] : v) {
    rank = r->Get<int32_t>();
    version = r->Get<uint64_t>();
  }
  return v;
}

std::string Encode(const RegisterMsg& m) {
  ByteWriter w;
  w.Put<int32_t>(m.slot);
  w.PutString(m.address);
  w.PutString(m.rack);
  w.Put<uint64_t>(m.epoch);
  w.PutOptionalU64(m.committed);
  PutRankVersions(m.catalog, &w);
  w.PutOptionalU64(m.parity);
  return w.data();
}

Status Decode(const std::string& payload, RegisterMsg* m) {
  ByteReader r(payload);
  m->slot = r.Get<int32_t>();
  m->address = r.GetString();
  m->rack = r.GetString();
  m->epoch = r.Get<uint64_t>();
  m->committed = r.GetOptionalU64();
  m->catalog = GetRankVersions(&r);
  m->parity = r.GetOptionalU64();
  return CheckRead(r, RegisterMsg::kType, payload.size());
}

std::string Encode(const AssignMsg& m) {
  ByteWriter w;
  for (int32_t v : {m.slot, m.first_rank, m.local_ranks, m.world_size, m.num_slots}) w.Put<int32_t>(v);
  return w.data();
}

Status Decode(const std::string& payload, AssignMsg* m) {
  ByteReader r(payload);
  for (int32_t* v : {&m->slot, &m->first_rank, &m->local_ranks, &m->world_size, &m->num_slots}) *v = r.Get<int32_t>();
  return CheckRead(r, AssignMsg::kType, payload.size());
}

std::string Encode(const MembershipMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  w.Put<uint32_t>(static_cast<uint32_t>(m.members.size()));
  for (const auto& x : m.members) {
    w.Put<uint32_t>(x.agent);
    w.Put<int32_t>(x.slot);
    w.PutString(x.address);
    w.Put<int32_t>(x.first_rank);
    w.Put<int32_t>(x.ranks);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(m.my_holders.size()));
  for (uint32_t h : m.my_holders) w.Put<uint32_t>(h);
  w.Put<uint32_t>(static_cast<uint32_t>(m.held_slots.size()));
  for (int32_t s : m.held_slots) w.Put<int32_t>(s);
  w.Put<int32_t>(m.erasure_data);
  w.Put<int32_t>(m.erasure_parity);
  w.Put<uint32_t>(static_cast<uint32_t>(m.group.size()));
  for (uint32_t a : m.group) w.Put<uint32_t>(a);
  w.Put<int32_t>(m.group_member);
  return w.Take();
}

Status Decode(const std::string& payload, MembershipMsg* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->members.resize(r.GetCount(20));
  for (auto& x : m->members) {
    x.agent = r.Get<uint32_t>();
    x.slot = r.Get<int32_t>();
    x.address = r.GetString();
    x.first_rank = r.Get<int32_t>();
    x.ranks = r.Get<int32_t>();
    if (r.ok() && (x.first_rank < 0 || x.ranks < 0 || (x.slot < 0 && x.ranks != 0))) {
      return Status::Corruption("membership: agent " + std::to_string(x.agent) + " has ranks [" +
                                std::to_string(x.first_rank) + ", +" + std::to_string(x.ranks) + ") for slot " +
                                std::to_string(x.slot));
    }
  }
  m->my_holders.resize(r.GetCount(4));
  for (auto& h : m->my_holders) h = r.Get<uint32_t>();
  m->held_slots.resize(r.GetCount(4));
  for (auto& s : m->held_slots) s = r.Get<int32_t>();
  m->erasure_data = r.Get<int32_t>();
  m->erasure_parity = r.Get<int32_t>();
  m->group.resize(r.GetCount(4));
  for (auto& a : m->group) a = r.Get<uint32_t>();
  m->group_member = r.Get<int32_t>();
  if (r.ok() && m->erasure_data > 0 &&
      (m->erasure_parity < 1 || m->group.size() != static_cast<size_t>(m->erasure_data + m->erasure_parity) ||
       m->group_member < 0 || m->group_member >= static_cast<int32_t>(m->group.size()))) {
    return Status::Corruption("membership: an erasure group of " + std::to_string(m->group.size()) +
                              " members for data " + std::to_string(m->erasure_data) + " + parity " +
                              std::to_string(m->erasure_parity) + ", receiver at " + std::to_string(m->group_member));
  }
  return CheckRead(r, MembershipMsg::kType, payload.size());
}

std::string Encode(const PullMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  w.Put<uint64_t>(m.version);
  w.Put<uint32_t>(static_cast<uint32_t>(m.ranks.size()));
  for (const auto& [rank, holders] : m.ranks) {
    w.Put<int32_t>(rank);
    w.Put<uint32_t>(static_cast<uint32_t>(holders.size()));
    for (uint32_t h : holders) w.Put<uint32_t>(h);
  }
  w.Put<uint8_t>(m.from_disk ? 1 : 0);
  w.Put<uint32_t>(static_cast<uint32_t>(m.group.size()));
  for (const ErasureSource& g : m.group) {
    w.Put<uint32_t>(g.agent);
    w.Put<uint8_t>(static_cast<uint8_t>((g.data ? 1 : 0) | (g.parity ? 2 : 0)));
  }
  w.Put<int32_t>(m.group_member);
  return w.data();
}

Status Decode(const std::string& payload, PullMsg* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->version = r.Get<uint64_t>();
  m->ranks.resize(r.GetCount(8));
  for (auto& [rank, holders] : m->ranks) {
    rank = r.Get<int32_t>();
    holders.resize(r.GetCount(4));
    for (auto& h : holders) h = r.Get<uint32_t>();
  }
  m->from_disk = r.Get<uint8_t>() != 0;
  m->group.resize(r.GetCount(5));
  for (ErasureSource& g : m->group) {
    g.agent = r.Get<uint32_t>();
    const uint8_t flags = r.Get<uint8_t>();
    g.data = flags & 1;
    g.parity = flags & 2;
  }
  m->group_member = r.Get<int32_t>();
  if (r.ok() && !m->group.empty() &&
      (m->group_member < 0 || m->group_member >= static_cast<int32_t>(m->group.size()))) {
    return Status::Corruption("pull: the receiver's place " + std::to_string(m->group_member) +
                              " is outside its erasure group of " + std::to_string(m->group.size()));
  }
  return CheckRead(r, PullMsg::kType, payload.size());
}

std::string Encode(const StartMsg& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  w.PutOptionalU64(m.version);
  w.PutString(m.master_addr);
  w.Put<int32_t>(m.master_port);
  w.PutString(m.store);
  return w.data();
}

Status Decode(const std::string& payload, StartMsg* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->version = r.GetOptionalU64();
  m->master_addr = r.GetString();
  m->master_port = r.Get<int32_t>();
  m->store = r.GetString();
  return CheckRead(r, StartMsg::kType, payload.size());
}

std::string ClusterMsgName(uint16_t type) {
  switch (static_cast<ClusterMsg>(type)) {
    case ClusterMsg::kRegister:
      return "register";
    case ClusterMsg::kHeartbeat:
      return "heartbeat";
    case ClusterMsg::kHeld:
      return "held";
    case ClusterMsg::kRankFailed:
      return "rank-failed";
    case ClusterMsg::kHalted:
      return "halted";
    case ClusterMsg::kReady:
      return "ready";
    case ClusterMsg::kNodeDone:
      return "node-done";
    case ClusterMsg::kFatal:
      return "fatal";
    case ClusterMsg::kRoundFailed:
      return "round-failed";
    case ClusterMsg::kPullFailed:
      return "pull-failed";
    case ClusterMsg::kDiskFailed:
      return "disk-failed";
    case ClusterMsg::kDropped:
      return "dropped";
    case ClusterMsg::kMissing:
      return "missing";
    case ClusterMsg::kParityHeld:
      return "parity-held";
    case ClusterMsg::kAssign:
      return "assign";
    case ClusterMsg::kMembership:
      return "membership";
    case ClusterMsg::kHalt:
      return "halt";
    case ClusterMsg::kPull:
      return "pull";
    case ClusterMsg::kStart:
      return "start";
    case ClusterMsg::kCommit:
      return "commit";
    case ClusterMsg::kStop:
      return "stop";
    case ClusterMsg::kFenced:
      return "fenced";
    case ClusterMsg::kCoordHeartbeat:
      return "coordinator-heartbeat";
    case ClusterMsg::kReplicate:
      return "replicate";
    case ClusterMsg::kDropAbove:
      return "drop-above";
    case ClusterMsg::kOffer:
      return "offer";
    case ClusterMsg::kWant:
      return "want";
    case ClusterMsg::kOfferFailed:
      return "offer-failed";
    case ClusterMsg::kStored:
      return "stored";
    case ClusterMsg::kPullRequest:
      return "pull-request";
    case ClusterMsg::kAbort:
      return "abort";
    case ClusterMsg::kParityOffer:
      return "parity-offer";
    case ClusterMsg::kParityWant:
      return "parity-want";
    case ClusterMsg::kParityRefused:
      return "parity-refused";
    case ClusterMsg::kParityApplied:
      return "parity-applied";
    case ClusterMsg::kGroupManifests:
      return "group-manifests";
    case ClusterMsg::kFragmentRequest:
      return "fragment-request";
    case ClusterMsg::kFragmentRefused:
      return "fragment-refused";
    case ClusterMsg::kFragmentManifests:
      return "fragment-manifests";
    case ClusterMsg::kFragmentReady:
      return "fragment-ready";
    case ClusterMsg::kFragmentGo:
      return "fragment-go";
  }
  return "message " + std::to_string(type);
}

std::string WithTerm(int64_t term, std::string payload) {
  ByteWriter w;
  w.Put<int64_t>(term);
  payload.insert(0, w.data());
  return payload;
}

bool TakeTerm(std::string* payload, int64_t* term) {
  ByteReader r(*payload);
  const int64_t t = r.Get<int64_t>();
  if (!r.ok()) return false;
  *term = t;
  payload->erase(0, sizeof(int64_t));
  return true;
}

}  // namespace ftrun
