// ftrun::Status: the one type for expected failures (I/O, bad input, a full
// store, a lost peer, a timeout). Broken invariants use FTRUN_CHECK instead.
// See docs/errors.md for which codes a caller can recover from.
#pragma once

#include <string>
#include <utility>

namespace ftrun {

enum class Code : int {
  kOk = 0,
  kInvalidArgument = 1,     // bad input from the caller: config, CLI, tensors
  kNotFound = 2,            // no such version, chunk or file
  kAlreadyExists = 3,       // a live agent owns the socket, a version exists
  kResourceExhausted = 4,   // the store budget cannot fit the save
  kFailedPrecondition = 5,  // e.g. version going backwards, layout changed
  kIoError = 6,             // a system call failed
  kCorruption = 7,          // a hash or checksum did not match
  kUnavailable = 8,         // the agent or a peer went away
  kTimeout = 9,
  kUnimplemented = 10,  // a feature not built in (e.g. CUDA without nvcc)
  kChunkMissing = 11,   // a referenced chunk is no longer in the store
  kIoTransient = 12,    // a disk read or write that may succeed if retried (EIO, ESTALE, EAGAIN, ETIMEDOUT)
};

const char* CodeName(Code code);

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {Code::kResourceExhausted, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {Code::kFailedPrecondition, std::move(m)}; }
  static Status IoError(std::string m) { return {Code::kIoError, std::move(m)}; }
  // Appends strerror(err) to the message.
  static Status FromErrno(const std::string& what, int err);
  static Status Corruption(std::string m) { return {Code::kCorruption, std::move(m)}; }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status Timeout(std::string m) { return {Code::kTimeout, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {Code::kUnimplemented, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", or "OK".
  std::string ToString() const;
  // Prefixes the message with context ("while X: ...") keeping the code.
  Status Annotate(const std::string& context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace ftrun

#define FTRUN_RETURN_IF_ERROR(expr) \
  do {                              \
    ::ftrun::Status _st = (expr);   \
    if (!_st.ok()) return _st;      \
  } while (0)
