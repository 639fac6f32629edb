#include "plugin/config/default_run_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace ftrun {
namespace {

// A per-user runtime directory we may put ours under: a real directory (not
// a link) of `uid` that nobody else can write. OpenPrivateDir checks the
// whole path again when the run dir is made.
bool Usable(const std::string& dir, uid_t uid) {
  struct stat st {};
  if (dir.empty() || dir[0] != '/' || ::lstat(dir.c_str(), &st) != 0) return false;
  return S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & 022) == 0;
}

}  // namespace

std::string ChooseRunDir(const char* xdg, uid_t uid, const std::string& run_user) {
  if (xdg != nullptr && Usable(xdg, uid)) return std::string(xdg) + "/ftrun";
  const std::string mine = run_user + "/" + std::to_string(uid);
  if (Usable(mine, uid)) return mine + "/ftrun";
  return "/tmp/ftrun-" + std::to_string(uid);
}

std::string DefaultRunDir() { return ChooseRunDir(std::getenv("XDG_RUNTIME_DIR"), ::geteuid(), "/run/user"); }

}  // namespace ftrun
