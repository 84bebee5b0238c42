// SPDX-License-Identifier: Apache-2.0
// Result<T>: a value or a non-ok Status (an expected-like type).
//
//   Result<uint64_t> r = file->Size();
//   if (!r.ok()) return r.status();
//   uint64_t n = *r;
//
// Accessing the value of a failed Result is a programming error (asserts).
// Thread safety: a value type, like Status.
#pragma once

#include <cassert>
#include <optional>
#include <utility>

#include "common/base/status.h"

namespace cdp {

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "Result built from an ok Status has no value");
    if (status_.ok()) status_ = Status::InvalidArgument("Result built from ok Status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::optional<T> value_;
  Status status_;  // ok iff value_ is set
};

// Assigns the value of a Result expression to `lhs`, or returns its Status.
#define CDP_ASSIGN_OR_RETURN(lhs, expr)                       \
  CDP_ASSIGN_OR_RETURN_IMPL(CDP_CONCAT(_cdp_r, __LINE__), lhs, expr)
#define CDP_CONCAT_INNER(a, b) a##b
#define CDP_CONCAT(a, b) CDP_CONCAT_INNER(a, b)
#define CDP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(*tmp)

}  // namespace cdp
