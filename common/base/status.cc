// SPDX-License-Identifier: Apache-2.0
#include "common/base/status.h"

#include <cerrno>
#include <cstring>

namespace cdp {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kNotFound: return "NotFound";
    case Code::kCorruption: return "Corruption";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kIOError: return "IOError";
    case Code::kNoSpace: return "NoSpace";
    case Code::kBusy: return "Busy";
    case Code::kUnavailable: return "Unavailable";
    case Code::kPermissionDenied: return "PermissionDenied";
    case Code::kOutOfRange: return "OutOfRange";
    case Code::kAlreadyExists: return "AlreadyExists";
    case Code::kAborted: return "Aborted";
    case Code::kNotSupported: return "NotSupported";
  }
  return "Unknown";
}

Status Status::FromErrno(int err, std::string_view context) {
  std::string msg(context);
  msg += ": ";
  msg += std::strerror(err);
  switch (err) {
    case 0: return Status();
    case ENOSPC:
    case EDQUOT: return Status(Code::kNoSpace, std::move(msg), err, true);
    case ENOENT: return Status(Code::kNotFound, std::move(msg), err);
    case EEXIST: return Status(Code::kAlreadyExists, std::move(msg), err);
    case EACCES:
    case EPERM: return Status(Code::kPermissionDenied, std::move(msg), err);
    case EINVAL: return Status(Code::kInvalidArgument, std::move(msg), err);
    case EAGAIN:
    case EINTR:
    case EBUSY: return Status(Code::kIOError, std::move(msg), err, true);
    default: return Status(Code::kIOError, std::move(msg), err);
  }
}

Status Status::WithContext(std::string_view prefix) const {
  if (ok()) return *this;
  Status s = *this;
  s.msg_ = std::string(prefix) + ": " + msg_;
  return s;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string s(CodeName(code_));
  s += ": ";
  s += msg_;
  return s;
}

}  // namespace cdp
