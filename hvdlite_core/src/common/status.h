// One status vocabulary for the whole core. The numeric values are the C ABI's hvdlite_status, so a Status
// crosses the ABI unchanged and Python maps each code to one exception class.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

namespace hvdlite {

enum class StatusCode : int {
  kOk = 0,
  kInProgress = 1,
  kInvalidArgument = 2,
  kPrecondition = 3,
  kMismatch = 4,
  kRemoteError = 5,
  kTimeout = 6,
  kInternal = 7,
  kAborted = 8,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Thrown by transports and algorithms; caught once by the background loop, which turns it into a Status
// for every pending handle. Exceptions keep the collective algorithms free of error plumbing.
class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }
  Status status() const { return Status(code_, what()); }

 private:
  StatusCode code_;
};

}  // namespace hvdlite
