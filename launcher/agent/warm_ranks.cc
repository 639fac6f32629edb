// WarmRanks: the control links, a survivor's abort and park, its resume,
// and the standbys that take dead ranks' places.
#include "launcher/agent/warm_ranks.h"

#include <signal.h>

#include <algorithm>

#include "launcher/agent/release_connections.h"
#include "launcher/common/supervisor.h"
#include "plugin/common/log.h"

namespace ftrun {

namespace {
constexpr int kMaxFailedStandbys = 3;
}

WarmRanks::WarmRanks(RankProcesses* ranks, RankServer* server, Hooks hooks, Options o, const Clock& clock)
    : ranks_(ranks), server_(server), h_(std::move(hooks)), o_(o), clock_(clock) {}

WarmRanks::~WarmRanks() {
  for (const Standby& sb : standbys_) SignalGroup(sb.pid, SIGKILL);
}

WarmRanks::Slot* WarmRanks::SlotOf(uint64_t control_id) {
  if (control_id == 0) return nullptr;
  for (Slot& s : ranks_->slots()) {
    if (s.control_id == control_id) return &s;
  }
  return nullptr;
}

void WarmRanks::Frame(Connection& conn, MsgType type, const std::string& payload) {
  if (type == MsgType::kWarmHello && !conn.greeted()) return Hello(conn, payload);
  if (type == MsgType::kWarmParked && conn.control) return Parked(conn, payload);
  if (type == MsgType::kWarmFailed && conn.control) return Raised(conn, payload);
  server_->Drop(conn, Status::InvalidArgument("unexpected warm frame type " + std::to_string(static_cast<int>(type)) +
                                              (conn.control ? " on a control link" : " before a warm hello")));
}

void WarmRanks::Hello(Connection& conn, const std::string& payload) {
  WarmFields f;
  Status s = DecodeWarmFields(payload, &f);
  const std::string role = f.count("role") ? f["role"] : "";
  if (s.ok() && f.count("job") && f["job"] != h_.job_id())
    s = Status::FailedPrecondition("warm hello for job '" + f["job"].substr(0, 64) + "', this agent runs '" +
                                   h_.job_id() + "'");
  if (s.ok() && role == "rank") {
    long long rank = -1;
    s = WarmInt(f, "rank", 0, 1 << 24, &rank);
    Slot* slot = s.ok() ? ranks_->ByRank(static_cast<int>(rank)) : nullptr;
    if (s.ok() && (slot == nullptr || slot->pid != conn.pid || slot->control_id != 0)) {
      s = Status::FailedPrecondition("warm hello as rank " + std::to_string(rank) + " from pid " +
                                     std::to_string(conn.pid) +
                                     ": not that rank's process of this node, or it has a "
                                     "control link already");
    }
    if (s.ok()) {
      conn.control = true;
      slot->control_id = conn.id;
      if (slot->warm == Slot::Warm::kCold) slot->warm = Slot::Warm::kRunning;
      if (!decorated_) FTRUN_LOG_INFO("rank {} runs under @ftrun.resilient: warm recovery on", rank);
      decorated_ = true;
      h_.changed();
      return Refill();
    }
  } else if (s.ok() && role == "standby") {
    auto it = std::find_if(standbys_.begin(), standbys_.end(),
                           [&](const Standby& sb) { return sb.pid == conn.pid && sb.control_id == 0; });
    if (it == standbys_.end()) {
      s = Status::FailedPrecondition("warm hello as a standby from pid " + std::to_string(conn.pid) +
                                     ": not a standby this agent started, or it has a control link already");
    } else {
      conn.control = true;
      failed_standbys_ = 0;
      FTRUN_LOG_INFO("warm standby pid {} is ready", it->pid);
      Slot* slot = it->assigned >= 0 ? ranks_->ByRank(it->assigned) : nullptr;
      if (slot != nullptr && slot->pid == it->pid) {  // given a rank while it started up
        slot->control_id = conn.id;
        SendStart(conn.id, *slot, it->generation, it->restore);
        standbys_.erase(it);
      } else {
        it->control_id = conn.id;
      }
      h_.changed();
      return;
    }
  } else if (s.ok()) {
    s = Status::InvalidArgument("warm hello: field 'role' must be rank or standby, got '" + role.substr(0, 64) + "'");
  }
  FTRUN_LOG_WARN("refused warm hello from pid {}: {}", conn.pid, s.message());
  (void)conn.SendError(s);
  server_->Close(conn.id, "warm hello refused");
}

// A frame about one generation of the link's rank: its slot when the
// generation is `generation` and the slot is in state `in`, else nullptr
// (a late frame). A malformed frame drops the link.
WarmRanks::Slot* WarmRanks::SlotFrame(Connection& conn, const std::string& payload, Slot::Warm in, int generation,
                                      WarmFields* f) {
  long long g = -1;
  Status s = DecodeWarmFields(payload, f);
  if (s.ok()) s = WarmInt(*f, "generation", 0, INT32_MAX, &g);
  if (!s.ok()) {
    server_->Drop(conn, s);
    return nullptr;
  }
  Slot* slot = SlotOf(conn.id);
  return slot != nullptr && slot->warm == in && g == generation ? slot : nullptr;
}

void WarmRanks::Parked(Connection& conn, const std::string& payload) {
  WarmFields f;
  if (Slot* slot = SlotFrame(conn, payload, Slot::Warm::kAborting, aborting_generation_, &f)) {
    long long rendezvous = 0;
    if (f.count("rendezvous") != 0) {
      Status s = WarmInt(f, "rendezvous", 0, 1, &rendezvous);
      if (!s.ok()) return server_->Drop(conn, s);
    }
    rendezvous_ = rendezvous_ || rendezvous == 1;
    slot->warm = Slot::Warm::kParked;
    CheckLeft();
  }
}

void WarmRanks::Raised(Connection& conn, const std::string& payload) {
  WarmFields f;
  if (Slot* slot = SlotFrame(conn, payload, Slot::Warm::kRunning, generation_, &f)) {
    slot->warm = Slot::Warm::kAborting;  // it leaves by itself: no kWarmAbort
    ShutDownConnections(*slot);
    h_.raised(*slot, f["reason"].substr(0, 2000));
  }
}

void WarmRanks::Closed(Connection& conn) {
  if (!conn.control) return;
  if (Slot* slot = SlotOf(conn.id)) {
    slot->control_id = 0;
    if (slot->kept()) {
      Unkeep(*slot,
             "closed its control link while kept for the next generation; its place goes to a standby or "
             "a new process");
    } else {
      slot->warm = Slot::Warm::kCold;  // it finished, or is going
    }
    return CheckLeft();
  }
  for (Standby& sb : standbys_) {
    if (sb.control_id == conn.id) {
      FTRUN_LOG_WARN("warm standby pid {} closed its control link: killed", sb.pid);
      sb.control_id = 0;
      SignalGroup(sb.pid, SIGKILL);  // reaped: StandbyExited
    }
  }
}

void WarmRanks::Abort(int generation, std::function<void()> left) {
  aborting_generation_ = generation;
  abort_deadline_ = clock_.Now() + o_.abort_timeout;
  const std::string payload = EncodeWarmFields({{"generation", std::to_string(generation)}});
  for (Slot& s : ranks_->slots()) {
    if (s.pid == 0 || s.warm != Slot::Warm::kRunning || s.control_id == 0) continue;
    Connection* c = server_->Find(s.control_id);
    if (c == nullptr || !c->Send(MsgType::kWarmAbort, payload).ok()) continue;
    s.warm = Slot::Warm::kAborting;
    ShutDownConnections(s);
  }
  left_ = std::move(left);
  CheckLeft();
}

void WarmRanks::SlotExited() { CheckLeft(); }

void WarmRanks::ShutDownConnections(Slot& slot) {
  if (slot.pid == 0) return;
  int store_port = -1;
  WarmFields vars = h_.variables(slot, generation_);
  if (auto it = vars.find("MASTER_PORT"); it != vars.end()) store_port = std::atoi(it->second.c_str());
  int released = 0;
  Status s = ReleaseConnections(slot.pid, store_port, &slot.sockets_settled, &released);
  if (!s.ok()) FTRUN_LOG_WARN("rank {}: cannot release its connections: {}", slot.global_rank, s.message());
  if (released > 0)
    FTRUN_LOG_DEBUG("rank {}: shut down {} connections of generation {}", slot.global_rank, released, generation_);
}

void WarmRanks::CheckLeft() {
  if (!left_) return;
  for (const Slot& s : ranks_->slots()) {
    if (s.pid != 0 && s.warm == Slot::Warm::kAborting) return;
  }
  auto left = std::move(left_);
  left_ = nullptr;
  left();
}

void WarmRanks::Unkeep(Slot& slot, const std::string& why) {
  FTRUN_LOG_WARN("rank {} (pid {}) {}: killed", slot.global_rank, slot.pid, why);
  slot.warm = Slot::Warm::kCold;
  SignalGroup(slot.pgid, SIGKILL);
  if (uint64_t id = slot.control_id) {
    slot.control_id = 0;
    server_->Close(id, "rank killed");
  }
}

bool WarmRanks::Resume(Slot& slot, int generation, const std::optional<uint64_t>& restore) {
  if (released_) return false;
  if (slot.pid != 0) {
    if (slot.warm != Slot::Warm::kParked || slot.control_id == 0) return false;
    ranks_->Reuse(slot, slot.pid, slot.pgid);
    slot.sockets_settled = SocketInodes(slot.pid);
    slot.warm = Slot::Warm::kRunning;
    SendStart(slot.control_id, slot, generation, restore);
    ++resumed_.survivors;
    return true;
  }
  auto it = std::find_if(standbys_.begin(), standbys_.end(), [](const Standby& sb) { return sb.assigned < 0; });
  if (it == standbys_.end()) return false;
  // A standby still starting up is waited for, not skipped: it gets the
  // rank now and its start when it says hello.
  ranks_->Reuse(slot, it->pid, it->pid);
  slot.sockets_settled = SocketInodes(it->pid);
  slot.warm = Slot::Warm::kRunning;
  slot.control_id = it->control_id;
  FTRUN_LOG_INFO("rank {}: warm standby pid {} takes its place{}", slot.global_rank, it->pid,
                 it->control_id ? "" : " (once it is up)");
  if (it->control_id != 0) {
    SendStart(it->control_id, slot, generation, restore);
    standbys_.erase(it);
  } else {
    it->assigned = slot.global_rank;
    it->generation = generation;
    it->restore = restore;
  }
  ++resumed_.standbys;
  Refill();
  return true;
}

void WarmRanks::SendStart(uint64_t control_id, const Slot& slot, int generation,
                          const std::optional<uint64_t>& restore) {
  WarmFields f;
  for (const auto& [k, v] : h_.variables(slot, generation)) f["env." + k] = v;
  f["generation"] = std::to_string(generation);
  f["rank"] = std::to_string(slot.global_rank);
  f["local_rank"] = std::to_string(slot.local_rank);
  f["restore"] = restore ? std::to_string(*restore) : "none";
  f["rendezvous"] = rendezvous_ ? "1" : "0";
  Connection* c = server_->Find(control_id);
  if (c == nullptr || !c->Send(MsgType::kWarmStart, EncodeWarmFields(f)).ok()) {
    FTRUN_LOG_WARN("rank {}: cannot send its warm start (its control link is gone): killed", slot.global_rank);
    SignalGroup(slot.pgid, SIGKILL);  // reaped as the rank's death
  }
}

bool WarmRanks::StandbyExited(pid_t pid) {
  auto it = std::find_if(standbys_.begin(), standbys_.end(), [&](const Standby& sb) { return sb.pid == pid; });
  if (it == standbys_.end()) return false;
  const bool assigned = it->assigned >= 0;
  if (!assigned && it->control_id == 0 && !released_) {
    ++failed_standbys_;
    FTRUN_LOG_WARN(
        "warm standby pid {} exited before it was up (does the script call its training function "
        "under @ftrun.resilient?){}",
        pid, failed_standbys_ >= kMaxFailedStandbys ? ": no more standbys are started" : "");
  }
  SignalGroup(pid, SIGKILL);  // what it left behind
  standbys_.erase(it);
  h_.changed();
  return !assigned;  // an assigned one was a rank: its slot learns of it
}

void WarmRanks::Release() {
  released_ = true;
  for (Slot& s : ranks_->slots()) {
    if (s.kept()) Unkeep(s, "kept for a restart that will not come (the job ends)");
  }
  for (Standby& sb : standbys_) {
    if (sb.assigned < 0) SignalGroup(sb.pid, SIGKILL);
  }
  CheckLeft();
}

void WarmRanks::Tick() {
  for (Slot& s : ranks_->slots()) {
    if (left_ && s.warm == Slot::Warm::kAborting) ShutDownConnections(s);  // connections opened since
  }
  if (left_ && clock_.Now() >= abort_deadline_) {
    for (Slot& s : ranks_->slots()) {
      if (s.pid != 0 && s.warm == Slot::Warm::kAborting)
        Unkeep(s, "did not leave its generation within restart.abort_timeout (" +
                      std::to_string(o_.abort_timeout.count()) + " ms); its place goes to a standby or a new process");
    }
    CheckLeft();
  }
  Refill();
}

int WarmRanks::wanted() const { return o_.standbys >= 0 ? o_.standbys : (decorated_ ? 1 : 0); }

void WarmRanks::Refill() {
  if (released_ || failed_standbys_ >= kMaxFailedStandbys || (h_.quiet && !h_.quiet())) return;
  int free = static_cast<int>(
      std::count_if(standbys_.begin(), standbys_.end(), [](const Standby& sb) { return sb.assigned < 0; }));
  while (free < wanted()) {
    Standby sb;
    if (Status s = h_.spawn_standby(&sb.pid); !s.ok()) {
      FTRUN_LOG_ERROR("cannot start a warm standby: {}; no more are started", s.message());
      failed_standbys_ = kMaxFailedStandbys;
      return;
    }
    sb.started = clock_.Now();
    FTRUN_LOG_INFO("started warm standby pid {}", sb.pid);
    standbys_.push_back(sb);
    ++free;
    h_.changed();
  }
}

int WarmRanks::standbys_ready() const {
  return static_cast<int>(std::count_if(standbys_.begin(), standbys_.end(),
                                        [](const Standby& sb) { return sb.assigned < 0 && sb.control_id != 0; }));
}

nlohmann::json WarmRanks::ToJson() const {
  nlohmann::json pids = nlohmann::json::array();
  for (const Standby& sb : standbys_) {
    if (sb.assigned < 0) pids.push_back(sb.pid);
  }
  return {{"wanted", wanted()}, {"ready", standbys_ready()}, {"pids", pids}, {"decorated", decorated_}};
}

}  // namespace ftrun
