#include "ftrun/status.h"

#include <cstring>

namespace ftrun {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case Code::kNotFound:
      return "NOT_FOUND";
    case Code::kAlreadyExists:
      return "ALREADY_EXISTS";
    case Code::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case Code::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case Code::kIoError:
      return "IO_ERROR";
    case Code::kCorruption:
      return "CORRUPTION";
    case Code::kUnavailable:
      return "UNAVAILABLE";
    case Code::kTimeout:
      return "TIMEOUT";
    case Code::kUnimplemented:
      return "UNIMPLEMENTED";
    case Code::kChunkMissing:
      return "CHUNK_MISSING";
    case Code::kIoTransient:
      return "IO_TRANSIENT";
  }
  return "UNKNOWN";
}

Status Status::FromErrno(const std::string& what, int err) {
  return Status(Code::kIoError, what + ": " + std::strerror(err));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::Annotate(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace ftrun
