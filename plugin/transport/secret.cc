#include "plugin/transport/secret.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "plugin/common/fd.h"

namespace ftrun {
std::string ToHex(const unsigned char* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[p[i] >> 4]);
    s.push_back(kDigits[p[i] & 15]);
  }
  return s;
}

Status WriteNewSecretFile(const std::string& path) {
  unsigned char raw[kSecretBytes];
  if (RAND_bytes(raw, sizeof(raw)) != 1) return Status::IoError("cannot generate a job secret: RAND_bytes failed");
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::FromErrno("cannot create secret file " + path, errno);
  std::string text = ToHex(raw, sizeof(raw)) + "\n";
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return Status::FromErrno("cannot write secret file " + path, errno);
  }
  return Status::Ok();
}

Status ReadSecretFile(const std::string& path, std::string* secret) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));  // never through a link
  if (!fd.valid() && errno == ELOOP) {
    return Status::FailedPrecondition("secret file " + path + " is a symbolic link; expected a regular file");
  }
  if (!fd.valid()) return Status::FromErrno("cannot open secret file " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("cannot stat secret file " + path, errno);
  if (!S_ISREG(st.st_mode)) return Status::FailedPrecondition("secret file " + path + " is not a regular file");
  if (st.st_mode & 077) {
    return Status::FailedPrecondition("secret file " + path + " is readable by group or others (mode " +
                                      std::to_string(st.st_mode & 0777) +
                                      " octal-as-decimal); expected mode 0600, owned by the job's user");
  }
  if (st.st_uid != ::getuid()) {
    return Status::FailedPrecondition("secret file " + path + " is owned by uid " + std::to_string(st.st_uid) +
                                      ", not by this job's user (uid " + std::to_string(::getuid()) + ")");
  }
  char buf[256];
  ssize_t n = ::read(fd.get(), buf, sizeof(buf));
  if (n < 0) return Status::FromErrno("cannot read secret file " + path, errno);
  std::string text(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.size() != 2 * kSecretBytes || text.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return Status::InvalidArgument("secret file " + path + ": expected " + std::to_string(2 * kSecretBytes) +
                                   " lowercase hex digits on one line, got " + std::to_string(text.size()) +
                                   " characters");
  }
  *secret = text;
  return Status::Ok();
}

}  // namespace ftrun
