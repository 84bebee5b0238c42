// SPDX-License-Identifier: Apache-2.0
// Churn profile: bytes written per interval over time, the input of `plan`.
//
// CSV format (docs/loadgen.md, docs/formats/churn-profile.md), version 1:
//
//   # comment lines start with '#'
//   timestamp,bytes,seconds
//   1795000000,52428800,60
//   1795000060,10485760,60
//
//   timestamp  start of the interval, Unix seconds (a decimal fraction is allowed)
//   bytes      bytes written by the application during the interval (>= 0)
//   seconds    length of the interval (> 0); optional column: when the header
//              (or the row) has only two columns, an interval lasts until the
//              next row's timestamp, and the last one as long as the one before.
// The header line is optional. Timestamps must increase strictly. At most
// 10 million rows.
//
// `cdp-loadgen record` writes this format from an agent's /metrics
// (cdp_agent_captured_bytes_total), see scrape.h.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/result.h"

namespace cdp::loadgen {

struct ProfileSample {
  double timestamp = 0;  // Unix seconds
  double bytes = 0;
  double seconds = 0;    // interval length
};

struct Profile {
  std::vector<ProfileSample> samples;
  double total_bytes() const;
  double total_seconds() const;
};

// Failure: kInvalidArgument naming the line ("profile line 7: ...").
Result<Profile> ParseProfileCsv(std::string_view text);
// The three-column form, with a header.
std::string FormatProfileCsv(const Profile& p);

}  // namespace cdp::loadgen
