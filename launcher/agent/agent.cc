#include "launcher/agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>

#include "launcher/common/disk_worker.h"
#include "launcher/agent/rank_env.h"
#include "plugin/common/bytes.h"
#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "plugin/common/safe_dir.h"
#include "plugin/config/units.h"
#include "plugin/ipc/unix_socket.h"

namespace ftrun {
namespace {

constexpr auto kTick = std::chrono::milliseconds(20);

}  // namespace

Agent::Agent(AgentOptions options) : o_(std::move(options)) {}
Agent::~Agent() {
  stop_prefault_ = true;
  if (prefault_.joinable()) prefault_.join();
}

Status Agent::Setup() {
  const Config& c = o_.config;
  // First: every thread started later inherits the signal mask, so these
  // signals only ever arrive through the loop.
  FTRUN_RETURN_IF_ERROR(loop_.Open({SIGCHLD, SIGTERM, SIGINT, SIGHUP}, kTick));
  if (o_.each_rank_log_dir.empty()) {
    rank_output_ = std::make_unique<RankOutput>(STDERR_FILENO);
    FTRUN_RETURN_IF_ERROR(rank_output_->Start());
  }
  FTRUN_RETURN_IF_ERROR(InstanceLock::Claim(c.agent.run_dir, o_.job_id, o_.agent_id, &lock_));
  if (lock_.removed_stale_socket()) {
    FTRUN_LOG_WARN("removed a stale socket {} left by an agent that is gone", lock_.socket_path());
  }
  FTRUN_RETURN_IF_ERROR(Arena::Create(o_.job_id, static_cast<uint32_t>(o_.agent_id), c.store.memory_budget,
                                      c.store.chunk_size, &arena_));
  if (c.store.prefault) {
    // On a thread: ranks start meanwhile; it is joined before the arena goes.
    prefault_ = std::thread([this] {
      auto t0 = Clock::now();
      if (!arena_.Prefault(&stop_prefault_)) return;
      prefaulted_ = true;
      FTRUN_LOG_INFO("store of {} pre-faulted in {:.0f} ms", FormatSize(arena_.size()), Ms(Clock::now() - t0));
    });
  }
  store_ = std::make_unique<SnapshotStore>(arena_.data_offset(), arena_.data_bytes(),
                                           FormatLoc(c.store.memory_budget_loc, "store.memory_budget"));
  RankProcesses::Options ro;
  ro.stop_grace = c.job.stop_grace;
  ro.hang_timeout = c.job.hang_timeout;
  ranks_ = std::make_unique<RankProcesses>(ftrun::Clock::Steady(), ro);
  ranks_->Assign(o_.first_global_rank, o_.spare ? 0 : o_.local_ranks);
  retention_ = std::make_unique<VersionRetention>(store_.get(), &tracker_);
  service_ = std::make_unique<StoreService>(store_.get(), &tracker_, retention_.get(), c.store.chunk_size);
  service_->on_saved = [this](int rank, uint64_t version) {
    if (RankSlot* s = ranks_->ByRank(rank)) RankEvent(*s, &RankSlot::first_step);
    ClusterRankSaved(rank, version);
  };
  service_->on_committed = [this](uint64_t version) {
    status_dirty_ = true;
    PersistCommitted(version);
  };

  FTRUN_RETURN_IF_ERROR(BecomeSubreaper());
  ::signal(SIGPIPE, SIG_IGN);
  FTRUN_RETURN_IF_ERROR(ListenUnix(lock_.socket_path(), &listen_));
  spare_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  FTRUN_RETURN_IF_ERROR(loop_.Add(listen_.get(), kListenTag));
  FTRUN_RETURN_IF_ERROR(remote() ? SetupCluster() : SetupLocalCoordinator());
  if (o_.save_pid > 0) {
    // /tmp is shared: created new, never through a link (safe_dir.h).
    FTRUN_RETURN_IF_ERROR(CreateNewFile("/tmp/" + std::to_string(o_.save_pid) + ".deepspeed",
                                        std::to_string(::getpid()) + "\n"));
  }
  return Status::Ok();
}

int Agent::Run() {
  Status s = Setup();
  if (!s.ok()) {
    FTRUN_LOG_ERROR("cannot start: {}", s.message());
    return 2;
  }
  FTRUN_LOG_INFO("job {} node {}: {} ranks (global {}..{} of {}), store {} in {} chunks, socket {}", o_.job_id,
                 o_.node_rank, o_.local_ranks, o_.first_global_rank, o_.first_global_rank + o_.local_ranks - 1,
                 o_.world_size, FormatSize(arena_.data_bytes()), FormatSize(o_.config.store.chunk_size),
                 lock_.socket_path());
  state_ = State::kIdle;  // the coordinator says when to start (or what to restore from disk first)
  PumpCoordinator();
  Loop();
  DrainPersist();
  WriteStatus();
  return exit_code_;
}

void Agent::Loop() {
  std::vector<EventLoop::Ready> ready;
  while (state_ != State::kDone) {
    if (Status s = loop_.Wait(&ready); !s.ok()) {
      FTRUN_LOG_ERROR("{}", s.message());
      exit_code_ = 2;
      return;
    }
    for (size_t i = 0; i < ready.size() && state_ != State::kDone; ++i) {
      const uint64_t tag = ready[i].tag;
      if (tag == kListenTag) Accept();
      else if (tag == EventLoop::kSignalTag) Signals();
      else if (tag == EventLoop::kTickTag) Tick();
      else if (tag == kTransportTag) TransportEvents();
      else if (tag == kFlushTag) flusher_->OnEvent(Clock::now());
      else if (tag == kDiskTag) disk_worker_->RunCompleted();
      else {
        if (ready[i].events & EPOLLOUT) Writable(tag);
        if (ready[i].events & ~static_cast<uint32_t>(EPOLLOUT)) Readable(tag);
      }
    }
    SyncConnections();
    PumpCoordinator();
  }
}

void Agent::Accept() {
  while (true) {
    UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      if ((errno == EMFILE || errno == ENFILE) && spare_fd_.valid()) {
        // Out of descriptors: refuse one pending connection (free the spare
        // fd, accept, close, take the spare back) rather than spin on a
        // listen socket that stays readable.
        spare_fd_.Reset();
        bool dropped = UniqueFd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC)).valid();
        spare_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (dropped) {
          FTRUN_LOG_ERROR("out of file descriptors: refused a connection");
          continue;
        }
      } else if (errno == EMFILE || errno == ENFILE) {
        // No spare either: stop listening for a while (Tick resumes it).
        FTRUN_LOG_ERROR("out of file descriptors: not accepting connections for 1 s");
        loop_.Remove(listen_.get());
        listen_paused_until_ = Clock::now() + std::chrono::seconds(1);
      }
      return;  // EAGAIN, or a transient error such as ECONNABORTED
    }
    PeerCredentials cred{};
    Status s = GetPeerCredentials(fd.get(), &cred);
    if (!s.ok() || cred.uid != ::getuid()) {
      FTRUN_LOG_WARN("refused a connection from pid {} uid {}: only uid {} may use this agent", cred.pid, cred.uid,
                     ::getuid());
      continue;
    }
    // Connections that have not said hello cost a descriptor and a buffer
    // each, and any process of our uid can open them: bounded.
    size_t pending = 0;
    for (const auto& [id, c] : conns_) pending += c->rank < 0;
    if (pending >= MaxPendingHello()) {
      if (refused_pending_++ % 100 == 0) {
        FTRUN_LOG_WARN("refused a connection from pid {}: {} connections have not said hello yet (limit {}; "
                       "{} refused so far)", cred.pid, pending, MaxPendingHello(), refused_pending_);
      }
      continue;
    }
    auto conn = std::make_unique<Connection>();
    conn->reader.set_max_frame(Connection::kMaxHelloFrame);
    conn->id = next_conn_id_++;
    conn->fd = std::move(fd);
    conn->pid = cred.pid;
    conn->accepted = Clock::now();
    if (!loop_.Add(conn->fd.get(), conn->id, EPOLLIN | EPOLLRDHUP).ok()) continue;
    conns_[conn->id] = std::move(conn);
  }
}

void Agent::Readable(uint64_t conn_id) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  Connection& conn = *it->second;
  // At most kReadBudget bytes per wakeup: epoll is level-triggered, so the
  // rest is read on a later round, after the other connections had theirs.
  Status read = conn.reader.ReadFrom(conn.fd.get(), Connection::kReadBudget);
  MsgType type;
  std::string payload;
  const auto now = Clock::now();
  // Frames that arrived before a close still count (e.g. a last save).
  while (conns_.count(conn_id) && conn.reader.Next(&type, &payload)) {
    Status rate = conn.Received(now, payload.size());
    if (!rate.ok()) return Drop(conn, rate);
    Dispatch(conn, type, payload);
  }
  if (!conns_.count(conn_id)) return;
  if (!conn.reader.status().ok()) return Drop(conn, conn.reader.status());
  if (!read.ok() && read.code() != Code::kUnavailable) return Drop(conn, read);
  if (!read.ok()) Close(conn_id, read.message());
}

// A peer that broke the protocol (a bad or oversized frame, a flood) is cut
// off at once; the agent and the other connections go on.
void Agent::Drop(Connection& conn, const Status& why) {
  FTRUN_LOG_WARN("dropped the connection of {} (pid {}): {}",
                 conn.rank >= 0 ? "rank " + std::to_string(conn.rank) : std::string("a client before hello"), conn.pid,
                 why.message());
  (void)conn.SendError(why);
  Close(conn.id, why.message());
}

size_t Agent::MaxPendingHello() const { return std::max<size_t>(64, 2 * ranks_->slots().size()); }

void Agent::Writable(uint64_t conn_id) {
  auto it = conns_.find(conn_id);
  if (it != conns_.end()) (void)it->second->Flush();
}

void Agent::SyncConnections() {
  std::vector<uint64_t> broken;
  for (auto& [id, conn] : conns_) {
    if (conn->broken) {
      broken.push_back(id);
      continue;
    }
    if (conn->want_write == conn->polling_write) continue;
    const uint32_t events = EPOLLIN | EPOLLRDHUP | (conn->want_write ? EPOLLOUT : 0u);
    if (loop_.Modify(conn->fd.get(), id, events).ok()) conn->polling_write = conn->want_write;
  }
  for (uint64_t id : broken) Close(id, "a send to it failed");
}

void Agent::Dispatch(Connection& conn, MsgType type, const std::string& payload) {
  if (type == MsgType::kHello) return Hello(conn, payload);
  RankSlot* slot = conn.rank >= 0 ? ranks_->ByRank(conn.rank) : nullptr;
  if (slot == nullptr || conn.generation != generation_ || state_ != State::kRunning) {
    (void)conn.SendError(Status::FailedPrecondition("connection is not an accepted rank of the current generation"));
    return Close(conn.id, "request before hello or from a stopped generation");
  }
  slot->last_progress = Clock::now();
  if (type == MsgType::kProgress) return;
  if (type == MsgType::kLoadDone) RankEvent(*slot, &RankSlot::restored);
  if (type == MsgType::kCorruptChunk) return CorruptChunkReported(conn, payload);
  if (!service_->Handle(conn, type, payload)) {
    (void)conn.SendError(Status::InvalidArgument("unknown request type " + std::to_string(static_cast<int>(type))));
  }
}

void Agent::Hello(Connection& conn, const std::string& payload) {
  ByteReader r(payload);
  uint32_t protocol = r.Get<uint32_t>();
  int32_t rank = r.Get<int32_t>();
  (void)r.Get<int32_t>();  // the client's pid; SO_PEERCRED is what we trust
  std::string job = r.GetString();
  Status s;
  RankSlot* slot = ranks_->ByRank(rank);
  if (!r.ok()) s = Status::Corruption("malformed hello");
  else if (protocol != kProtocolVersion) s = Status::FailedPrecondition("client speaks protocol " + std::to_string(protocol) + ", agent " + std::to_string(kProtocolVersion));
  else if (!job.empty() && job != o_.job_id) s = Status::FailedPrecondition("client is in job '" + job + "', this agent serves job '" + o_.job_id + "'");
  else if (slot == nullptr) s = Status::InvalidArgument("rank " + std::to_string(rank) + " is not one of this node's ranks (" + std::to_string(o_.first_global_rank) + ".." + std::to_string(o_.first_global_rank + o_.local_ranks - 1) + ")");
  else if (state_ != State::kRunning || slot->pid == 0) s = Status::Unavailable("rank " + std::to_string(rank) + " is being stopped");
  else if (::getpgid(conn.pid) != slot->pid) s = Status::FailedPrecondition("pid " + std::to_string(conn.pid) + " is not rank " + std::to_string(rank) + "'s process (started by this agent as pid " + std::to_string(slot->pid) + ")");
  else if (slot->conn_id != 0) s = Status::AlreadyExists("rank " + std::to_string(rank) + " is already connected");
  if (!s.ok()) {
    FTRUN_LOG_WARN("refused hello from pid {}: {}", conn.pid, s.message());
    (void)conn.SendError(s);
    return Close(conn.id, "hello refused");
  }
  conn.rank = rank;
  conn.reader.set_max_frame(Connection::kMaxRankFrame);
  conn.generation = generation_;
  slot->conn_id = conn.id;
  slot->last_progress = Clock::now();
  ByteWriter w;
  w.PutString(o_.job_id);
  w.Put<int32_t>(o_.node_rank);
  w.Put<uint64_t>(o_.config.store.chunk_size);
  w.Put<uint8_t>(restore_version_.has_value());
  w.Put<uint64_t>(restore_version_.value_or(0));
  (void)conn.Send(MsgType::kHelloOk, w.data(), arena_.fd());
  RankEvent(*slot, &RankSlot::connected);
}

void Agent::Close(uint64_t conn_id, const std::string& why) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  Connection& conn = *it->second;
  FTRUN_LOG_DEBUG("connection {} (rank {}) closed: {}", conn_id, conn.rank, why);
  service_->Disconnected(conn);
  if (RankSlot* slot = conn.rank >= 0 ? ranks_->ByRank(conn.rank) : nullptr; slot && slot->conn_id == conn_id) {
    slot->conn_id = 0;
  }
  loop_.Remove(conn.fd.get());
  conns_.erase(it);
}

}  // namespace ftrun
