// The standby server: see standby.h. One thread, one poll() loop over the
// listening socket, a signalfd and the attached processes' sockets. Every
// read is non-blocking and bounded, and an attach must be complete within
// kAttachDeadline of its connect, so a slow or silent client (any process of
// the job's user) never holds up the other attaches or the epilog's stop.
#include "launcher/agent/standby.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "launcher/agent/cgroup_join.h"
#include "plugin/common/bytes.h"
#include "plugin/common/fd.h"
#include "plugin/common/log.h"
#include "plugin/common/safe_dir.h"
#include "plugin/ipc/unix_socket.h"
#include "plugin/ipc/wire.h"

namespace ftrun {

std::string DefaultStandbyDir() {
  const char* env = std::getenv("FTRUN_STANDBY_DIR");
  return env != nullptr && *env != '\0' ? env : "/run/ftrun";
}

std::string StandbySocketPath(const std::string& dir, const std::string& slurm_job) {
  return dir + "/slurm-" + slurm_job + ".sock";
}

namespace {

using Clock = std::chrono::steady_clock;

// An attach is two small frames sent at once; argv and environment fit in
// a few MiB (the kernel's own limit for execve is about that).
constexpr auto kAttachDeadline = std::chrono::seconds(5);
constexpr uint32_t kMaxAttachFrame = 8u << 20;
constexpr size_t kReadBudget = 1u << 20;
constexpr size_t kMaxPendingAttaches = 64;

struct Attached {
  UniqueFd sock;
  FrameReader reader;
  pid_t peer = 0;              // the attaching process (SO_PEERCRED)
  Clock::time_point deadline;  // for the attach to be complete
  bool got_attach = false;     // the kAttach frame came; kAttachFd is next
  std::string attach;          // its payload
  UniqueFd out_fd;             // and the descriptor it carried
  pid_t agent = 0;             // 0 until forked; then the agent until it is reaped
};

class Standby {
 public:
  explicit Standby(StandbyOptions o) : o_(std::move(o)) {}
  Status Listen();
  int Serve();

 private:
  void Accept();
  void FromAttached(uint64_t id);
  // Handles one frame; an error refuses the attach.
  Status OnFrame(Attached& a, MsgType type, const std::string& payload, UniqueFd fd);
  void ExpireAttaches();
  int PollTimeoutMs() const;
  Status Launch(Attached& a, UniqueFd err_fd);
  void Reap();
  void Shutdown(int signo);

  StandbyOptions o_;
  std::string sock_path_;
  UniqueFd listen_, signals_;
  std::map<uint64_t, Attached> attached_;  // by attach id
  uint64_t next_id_ = 1;
  int stops_ = 0;  // SIGTERM/SIGINT received
};

Status Standby::Listen() {
  if (::mkdir(o_.dir.c_str(), 0755) != 0 && errno != EEXIST) return Status::FromErrno("mkdir " + o_.dir, errno);
  // Root puts its socket, pid and log files there: every component must be
  // root's (or a root-owned sticky directory's) and not a planted link. It
  // stays 0755: the job's user must reach the socket.
  UniqueFd dir;
  FTRUN_RETURN_IF_ERROR(OpenPrivateDir(o_.dir, false, "the standby directory (FTRUN_STANDBY_DIR)", &dir));
  sock_path_ = StandbySocketPath(o_.dir, o_.slurm_job);
  UniqueFd probe;
  if (ConnectUnix(sock_path_, 0, &probe).ok()) {
    return Status::AlreadyExists("a standby agent for slurm job " + o_.slurm_job + " already listens on " + sock_path_);
  }
  ::unlink(sock_path_.c_str());  // stale: nobody answers
  FTRUN_RETURN_IF_ERROR(ListenUnix(sock_path_, &listen_));
  // Only the job's user (and root) may attach; the accept checks it again.
  if (::chown(sock_path_.c_str(), o_.job_uid, o_.job_gid) != 0) return Status::FromErrno("chown " + sock_path_, errno);
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  signals_.Reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signals_.valid()) return Status::FromErrno("signalfd", errno);
  return Status::Ok();
}

int Standby::Serve() {
  FTRUN_LOG_INFO("standby for slurm job {} (uid {}, gid {}) on {}", o_.slurm_job, o_.job_uid, o_.job_gid, sock_path_);
  while (stops_ == 0 || !attached_.empty()) {
    std::vector<pollfd> fds{{signals_.get(), POLLIN, 0}};
    std::vector<uint64_t> ids{0};
    if (listen_.valid()) {
      fds.push_back({listen_.get(), POLLIN, 0});
      ids.push_back(0);
    }
    for (const auto& [id, a] : attached_) {
      if (!a.sock.valid()) continue;
      fds.push_back({a.sock.get(), POLLIN, 0});
      ids.push_back(id);
    }
    if (::poll(fds.data(), fds.size(), PollTimeoutMs()) < 0 && errno != EINTR) {
      FTRUN_LOG_ERROR("standby: poll: {}", std::strerror(errno));
      return 1;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      const pollfd& p = fds[i];
      if (p.revents == 0) continue;
      if (ids[i] != 0) {
        FromAttached(ids[i]);
      } else if (p.fd == signals_.get()) {
        signalfd_siginfo si;
        while (::read(signals_.get(), &si, sizeof si) == sizeof si) {
          if (si.ssi_signo == SIGCHLD) {
            Reap();
          } else {
            Shutdown(static_cast<int>(si.ssi_signo));
          }
        }
      } else if (listen_.valid() && p.fd == listen_.get()) {
        Accept();
      }
    }
    ExpireAttaches();
  }
  FTRUN_LOG_INFO("standby for slurm job {}: stopped", o_.slurm_job);
  if (!o_.pid_file.empty()) ::unlink(o_.pid_file.c_str());
  return 0;
}

void Standby::Accept() {
  UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!c.valid()) return;
  PeerCredentials cred{};
  if (!GetPeerCredentials(c.get(), &cred).ok() || (cred.uid != 0 && cred.uid != o_.job_uid)) {
    FTRUN_LOG_WARN("standby: refused an attach from pid {} uid {}: not the job's user (uid {})", cred.pid, cred.uid,
                   o_.job_uid);
    (void)SendFrame(c.get(), MsgType::kAttachRefused,
                    "uid " + std::to_string(cred.uid) + " is not the user of slurm job " + o_.slurm_job);
    return;
  }
  size_t pending = 0;
  for (const auto& [id, a] : attached_) pending += a.agent == 0;
  if (pending >= kMaxPendingAttaches) {
    FTRUN_LOG_WARN("standby: refused an attach from pid {}: {} attaches are not complete yet", cred.pid, pending);
    (void)SendFrame(c.get(), MsgType::kAttachRefused, "too many attaches in progress; try again");
    return;
  }
  Attached& a = attached_[next_id_++];
  a.sock = std::move(c);
  a.peer = cred.pid;
  a.deadline = Clock::now() + kAttachDeadline;
  a.reader.set_max_frame(kMaxAttachFrame);
  a.reader.set_accept_fds(true);
}

// Attaches not complete by their deadline are refused.
void Standby::ExpireAttaches() {
  auto now = Clock::now();
  for (auto it = attached_.begin(); it != attached_.end();) {
    Attached& a = it->second;
    if (a.agent != 0 || now < a.deadline) {
      ++it;
      continue;
    }
    FTRUN_LOG_WARN("standby: the attach from pid {} was not complete within {} s: refused", a.peer,
                   std::chrono::duration_cast<std::chrono::seconds>(kAttachDeadline).count());
    (void)SendFrame(a.sock.get(), MsgType::kAttachRefused, "the attach was not complete in time");
    it = attached_.erase(it);
  }
}

int Standby::PollTimeoutMs() const {
  auto next = Clock::time_point::max();
  for (const auto& [id, a] : attached_) {
    if (a.agent == 0) next = std::min(next, a.deadline);
  }
  if (next == Clock::time_point::max()) return -1;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
  return static_cast<int>(std::clamp<long long>(ms, 0, 60000));
}

void Standby::FromAttached(uint64_t id) {
  auto it = attached_.find(id);
  if (it == attached_.end()) return;  // erased earlier in this round
  Attached& a = it->second;
  Status read = a.reader.ReadFrom(a.sock.get(), kReadBudget);
  MsgType type;
  std::string payload;
  Status s;
  for (UniqueFd fd; s.ok() && a.reader.Next(&type, &payload, &fd); fd.Reset()) {
    s = OnFrame(a, type, payload, std::move(fd));
  }
  if (s.ok()) s = a.reader.status();
  if (!s.ok() && a.agent == 0) {
    FTRUN_LOG_ERROR("standby: attach from pid {} refused: {}", a.peer, s.message());
    (void)SendFrame(a.sock.get(), MsgType::kAttachRefused, s.message());
    attached_.erase(it);
    return;
  }
  if (s.ok() && read.ok()) return;
  if (a.agent > 0) {  // the attached process is gone (its step was killed), or broke the protocol
    FTRUN_LOG_WARN("standby: the process attached to agent pid {} went away ({}): SIGTERM to the agent", a.agent,
                   s.ok() ? read.message() : s.message());
    ::kill(a.agent, SIGTERM);
    a.sock.Reset();
  } else {
    attached_.erase(it);
  }
}

Status Standby::OnFrame(Attached& a, MsgType type, const std::string& payload, UniqueFd fd) {
  if (a.agent > 0) {
    if (type != MsgType::kAttachSignal)
      return Status::InvalidArgument("unexpected message " + std::to_string(static_cast<int>(type)));
    ByteReader r(payload);
    int signo = r.Get<int32_t>();
    if (r.ok() && (signo == SIGINT || signo == SIGTERM || signo == SIGHUP)) ::kill(a.agent, signo);
    return Status::Ok();
  }
  if (type == MsgType::kAttach && !a.got_attach) {
    a.got_attach = true;
    a.attach = payload;
    a.out_fd = std::move(fd);
    return Status::Ok();
  }
  if (type == MsgType::kAttachFd && a.got_attach) return Launch(a, std::move(fd));
  return Status::InvalidArgument("attach: expected the attach message, then the attached process's stderr");
}

// Forks the agent for an attach: argv, environment and cwd from the kAttach
// frame, stdout from its descriptor, stderr from err_fd (the kAttachFd
// frame's). The child joins the attaching process's cgroup, drops to the
// job's user for good, and only then enters the working directory: what
// it may enter, and what the error says, is what the job's user may learn.
Status Standby::Launch(Attached& a, UniqueFd err_fd) {
  UniqueFd out_fd = std::move(a.out_fd);
  const std::string attach = std::move(a.attach);
  ByteReader r(attach);
  std::vector<std::string> argv, env;
  for (uint32_t n = r.GetCount(4); r.ok() && n > 0; --n) argv.push_back(r.GetString());
  for (uint32_t n = r.GetCount(4); r.ok() && n > 0; --n) env.push_back(r.GetString());
  std::string cwd = r.GetString();
  if (!r.ok() || !r.done() || argv.empty()) return Status::InvalidArgument("malformed attach message");
  if (!out_fd.valid() || !err_fd.valid()) {
    return Status::InvalidArgument("attach: expected the attached process's stdout and stderr");
  }
  const bool drop = ::getuid() == 0 && o_.job_uid != 0;
  const passwd* pw = drop ? ::getpwuid(o_.job_uid) : nullptr;
  const std::string user = pw != nullptr ? pw->pw_name : "";
  CgroupTarget cgroup = CgroupOf(a.peer);
  if (!cgroup.warning.empty()) FTRUN_LOG_WARN("standby: attach from pid {}: {}", a.peer, cgroup.warning);
  const std::string cwd_error = "cannot enter the working directory " + cwd;
  const std::string drop_error = "dropping to uid " + std::to_string(o_.job_uid) + " did not hold";
  env.push_back("FTRUN_STANDBY_CHILD=1");
  std::vector<char*> cargv, cenv;
  for (auto& s : argv) cargv.push_back(s.data());
  for (auto& s : env) cenv.push_back(s.data());
  cargv.push_back(nullptr);
  cenv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork", errno);
  if (pid == 0) {
    ::setsid();
    sigset_t all;
    sigemptyset(&all);
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    int null = ::open("/dev/null", O_RDONLY);
    ::dup2(null, 0);
    ::dup2(out_fd.get(), 1);
    ::dup2(err_fd.get(), 2);
    auto fail = [](const char* what) {
      std::fprintf(stderr, "ftrun standby: %s: %s\n", what, std::strerror(errno));
      ::_exit(2);
    };
    if (!cgroup.warning.empty()) std::fprintf(stderr, "ftrun standby: WARN: %s\n", cgroup.warning.c_str());
    if (cgroup.procs.valid()) {
      if (int err = JoinCgroup(cgroup); err != 0) {
        std::fprintf(stderr,
                     "ftrun standby: WARN: cannot join the job's cgroup %s: %s; the agent and its ranks run "
                     "outside the job's limits\n",
                     cgroup.dir.c_str(), std::strerror(err));
      }
    }
    if (drop) {
      if (!user.empty() ? ::initgroups(user.c_str(), o_.job_gid) != 0 : ::setgroups(0, nullptr) != 0) fail("setgroups");
      if (::setgid(o_.job_gid) != 0) fail("setgid");
      if (::setuid(o_.job_uid) != 0) fail("setuid");
      // For good: no way back to root, real, effective or saved.
      if (::setuid(0) == 0 || ::seteuid(0) == 0 || ::getuid() != o_.job_uid || ::geteuid() != o_.job_uid ||
          ::getgid() != o_.job_gid || ::getegid() != o_.job_gid) {
        errno = EPERM;
        fail(drop_error.c_str());
      }
    }
    // As the job's user: the error is what `cd` would tell that user.
    if (::chdir(cwd.c_str()) != 0) fail(cwd_error.c_str());
    ::execve("/proc/self/exe", cargv.data(), cenv.data());
    fail("exec ftrun-agent");
  }
  a.agent = pid;
  FTRUN_LOG_INFO("standby: started agent pid {} for an attach ({} arguments, cwd {})", pid, argv.size() - 1, cwd);
  return Status::Ok();
}

void Standby::Reap() {
  int st = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &st, WNOHANG)) > 0) {
    int code = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
    for (auto it = attached_.begin(); it != attached_.end(); ++it) {
      if (it->second.agent != pid) continue;
      FTRUN_LOG_INFO("standby: agent pid {} exited with {}", pid, code);
      if (it->second.sock.valid()) {
        ByteWriter w;
        w.Put<int32_t>(code);
        (void)SendFrame(it->second.sock.get(), MsgType::kAttachExit, w.data());
      }
      attached_.erase(it);
      break;
    }
  }
}

// First SIGTERM/SIGINT: no more attaches, SIGTERM to every agent (each stops
// its ranks within job.stop_grace); exit once they are gone. A second one:
// SIGKILL to the agents (their ranks die with them: PR_SET_PDEATHSIG).
void Standby::Shutdown(int signo) {
  ++stops_;
  int sig = stops_ == 1 ? SIGTERM : SIGKILL;
  size_t agents = 0;
  for (const auto& [id, a] : attached_) agents += a.agent > 0;
  FTRUN_LOG_WARN("standby: signal {}: {} to {} agent(s)", signo, sig == SIGTERM ? "SIGTERM" : "SIGKILL", agents);
  if (listen_.valid()) {
    listen_.Reset();
    ::unlink(sock_path_.c_str());
  }
  for (auto it = attached_.begin(); it != attached_.end();) {
    if (it->second.agent > 0) {
      ::kill(it->second.agent, sig);
      ++it;
    } else {
      it = attached_.erase(it);
    }
  }
}

}  // namespace

int RunStandby(int argc, char** argv) {
  StandbyOptions o;
  int code = 0;
  if (!ParseStandbyOptions(argc, argv, &o, &code)) return code;
  Standby standby(o);
  Status s = standby.Listen();
  if (s.code() == Code::kAlreadyExists) {
    std::printf("ftrun-agent --standby: %s; nothing to do\n", s.message().c_str());
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ftrun-agent --standby: %s\n", s.message().c_str());
    return 2;
  }
  if (!InitLogging("ftrun-standby", -1, -1, "info")) return 2;
  if (o.foreground ? !WritePidFile(o.pid_file) : !Detach(o)) return 2;
  return standby.Serve();
}

}  // namespace ftrun
