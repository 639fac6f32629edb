#include "plugin/client/attached_segment.h"

#include <sys/stat.h>

#include <cerrno>
#include <mutex>

namespace ftrun {
namespace {

struct Kept {
  std::mutex mu;
  std::shared_ptr<const Arena> arena;  // guarded by mu
  dev_t dev = 0;
  ino_t ino = 0;
  std::string job_id;
};

Kept& kept() {
  static Kept* k = new Kept;  // never destroyed: clients may close during static destruction
  return *k;
}

}  // namespace

Status AttachSegment(UniqueFd fd, const std::string& expected_job_id, std::shared_ptr<const Arena>* out) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("fstat of the store segment", errno);
  Kept& k = kept();
  std::lock_guard<std::mutex> lock(k.mu);
  if (k.arena && k.dev == st.st_dev && k.ino == st.st_ino && (expected_job_id.empty() || expected_job_id == k.job_id)) {
    *out = k.arena;
    return Status::Ok();  // (fd closes here)
  }
  auto arena = std::make_shared<Arena>();
  FTRUN_RETURN_IF_ERROR(Arena::Attach(std::move(fd), expected_job_id, arena.get()));
  k.arena = arena;
  k.dev = st.st_dev;
  k.ino = st.st_ino;
  k.job_id = expected_job_id;
  *out = std::move(arena);
  return Status::Ok();
}

}  // namespace ftrun
