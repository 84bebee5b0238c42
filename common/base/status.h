// SPDX-License-Identifier: Apache-2.0
// Status: the outcome of an operation on the data path.
//
// A Status is either ok or carries a code and a message with context
// ("open /var/lib/cdp/x.seg: No space left on device"). Modeled on leveldb's
// Status, plus the flags a WAN retry loop needs (RocksDB): `retryable()` says
// that the same call may succeed later (a dropped connection, a busy peer),
// `data_loss()` says that something acknowledged may be gone.
//
// errno values are converted in one place: Status::FromErrno. Asio error codes
// are converted in common/base/asio_status.h.
//
// Thread safety: a Status is a value; distinct objects may be used from
// distinct threads freely.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace cdp {

enum class Code : int {
  kOk = 0,
  kNotFound = 1,
  kCorruption = 2,          // a checksum or framing check failed
  kInvalidArgument = 3,     // the caller or the peer asked for something invalid
  kIOError = 4,             // the OS reported an error (see errno())
  kNoSpace = 5,             // ENOSPC or a quota is exhausted
  kBusy = 6,                // back-pressure: try again later
  kUnavailable = 7,         // the peer is gone; retryable
  kPermissionDenied = 8,    // authentication or tenant isolation refused it
  kOutOfRange = 9,          // offset/length outside the volume
  kAlreadyExists = 10,
  kAborted = 11,            // stopped on purpose (shutdown, cancel)
  kNotSupported = 12,
};

std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok

  static Status OK() { return Status(); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status IOError(std::string msg, int err = 0) { return Status(Code::kIOError, std::move(msg), err); }
  static Status NoSpace(std::string msg) { return Status(Code::kNoSpace, std::move(msg), 0, true); }
  static Status Busy(std::string msg) { return Status(Code::kBusy, std::move(msg), 0, true); }
  static Status Unavailable(std::string msg) { return Status(Code::kUnavailable, std::move(msg), 0, true); }
  static Status PermissionDenied(std::string msg) { return Status(Code::kPermissionDenied, std::move(msg)); }
  static Status OutOfRange(std::string msg) { return Status(Code::kOutOfRange, std::move(msg)); }
  static Status AlreadyExists(std::string msg) { return Status(Code::kAlreadyExists, std::move(msg)); }
  static Status Aborted(std::string msg) { return Status(Code::kAborted, std::move(msg)); }
  static Status NotSupported(std::string msg) { return Status(Code::kNotSupported, std::move(msg)); }

  // The one place errno becomes a Status: "context: strerror(err)".
  // ENOSPC/EDQUOT -> kNoSpace, ENOENT -> kNotFound, EACCES/EPERM -> kPermissionDenied,
  // EAGAIN/EINTR/EBUSY -> retryable kIOError, anything else kIOError.
  static Status FromErrno(int err, std::string_view context);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  int errno_value() const { return errno_; }
  bool retryable() const { return retryable_; }
  bool data_loss() const { return data_loss_; }

  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsCorruption() const { return code_ == Code::kCorruption; }
  bool IsNoSpace() const { return code_ == Code::kNoSpace; }
  bool IsBusy() const { return code_ == Code::kBusy; }

  Status& MarkDataLoss() { data_loss_ = true; return *this; }
  // Returns a copy whose message is "prefix: message".
  Status WithContext(std::string_view prefix) const;

  // "ok" or "Corruption: message".
  std::string ToString() const;

 private:
  Status(Code code, std::string msg, int err = 0, bool retryable = false)
      : code_(code), msg_(std::move(msg)), errno_(err), retryable_(retryable) {}

  Code code_ = Code::kOk;
  std::string msg_;
  int errno_ = 0;
  bool retryable_ = false;
  bool data_loss_ = false;
};

// Propagates a non-ok Status to the caller.
#define CDP_RETURN_IF_ERROR(expr)            \
  do {                                       \
    ::cdp::Status _cdp_s = (expr);           \
    if (!_cdp_s.ok()) return _cdp_s;         \
  } while (0)

}  // namespace cdp
