// The parts of Env that every implementation shares: whole-file reads on top
// of RandomAccessFile, and tree removal on top of ListDir/Delete*.
#include "plugin/persist/env.h"

namespace ftrun {

std::string WriteMode::ToString() const {
  std::string s = direct ? "O_DIRECT" : "buffered";
  s += queue_depth > 0 ? ", io_uring qd " + std::to_string(queue_depth) : ", pwrite";
  return s;
}

Status Env::ReadFile(const std::string& path, std::string* out) {
  std::unique_ptr<RandomAccessFile> f;
  FTRUN_RETURN_IF_ERROR(NewRandomAccessFile(path, &f));
  std::string bytes(f->size(), '\0');
  size_t got = 0;
  FTRUN_RETURN_IF_ERROR(f->Read(0, bytes.size(), bytes.data(), &got));
  bytes.resize(got);
  *out = std::move(bytes);
  return Status::Ok();
}

bool Env::FileExists(const std::string& path) {
  uint64_t size = 0;
  return GetFileSize(path, &size).ok();
}

Status Env::FreeSpace(const std::string& path, uint64_t*) {
  return Status::Unimplemented("free space of '" + path + "' is not known to this Env");
}

Status DeleteTree(Env* env, const std::string& path) {
  bool is_dir = false;
  Status st = env->IsDirectory(path, &is_dir);
  if (st.code() == Code::kNotFound) return Status::Ok();
  FTRUN_RETURN_IF_ERROR(st);
  if (!is_dir) return env->DeleteFile(path);
  std::vector<std::string> names;
  FTRUN_RETURN_IF_ERROR(env->ListDir(path, &names));
  for (const auto& name : names) FTRUN_RETURN_IF_ERROR(DeleteTree(env, path + "/" + name));
  return env->DeleteDir(path);
}

}  // namespace ftrun
