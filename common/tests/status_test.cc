// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <cerrno>

#include "common/base/result.h"
#include "common/base/status.h"

using namespace cdp;

TEST_CASE("errno maps to codes in one place", "[status]") {
  CHECK(Status::FromErrno(ENOSPC, "append x").IsNoSpace());
  CHECK(Status::FromErrno(ENOSPC, "append x").retryable());
  CHECK(Status::FromErrno(ENOENT, "open y").IsNotFound());
  CHECK(Status::FromErrno(EIO, "pread z").code() == Code::kIOError);
  CHECK(Status::FromErrno(EIO, "pread z").errno_value() == EIO);
  CHECK(Status::FromErrno(EIO, "pread z").ToString() == "IOError: pread z: Input/output error");
  CHECK(Status::FromErrno(0, "nothing").ok());
}

TEST_CASE("context is prefixed and ok stays ok", "[status]") {
  Status s = Status::Corruption("bad crc").WithContext("segment 7");
  CHECK(s.ToString() == "Corruption: segment 7: bad crc");
  CHECK(Status::OK().WithContext("x").ok());
}

static Result<int> Half(int v) {
  if (v % 2) return Status::InvalidArgument("odd");
  return v / 2;
}

static Status UseHalf(int v, int* out) {
  CDP_ASSIGN_OR_RETURN(*out, Half(v));
  return Status::OK();
}

TEST_CASE("Result carries a value or a status", "[status]") {
  int out = 0;
  CHECK(UseHalf(8, &out).ok());
  CHECK(out == 4);
  Status s = UseHalf(7, &out);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(out == 4);
}
