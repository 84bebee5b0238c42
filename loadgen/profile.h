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
// Version 1's optional columns, what `cdp-loadgen profile` writes
// (loadgen/device_profile.h): after `seconds`, the header names more columns,
// every row has them all:
//
//   timestamp,bytes,seconds,unique_bytes,lost_events,bytes:loop0,unique_bytes:loop0
//
//   unique_bytes     4 KiB blocks written in the interval, at least once,
//                    x 4096 (what a catch-up ships); empty when the source
//                    cannot tell (/proc/diskstats)
//   lost_events      write events the kernel dropped in the interval (the
//                    row's figures are short by them)
//   bytes:D, unique_bytes:D   the same per device D (their sums are the totals)
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
  ProfileSample() = default;
  ProfileSample(double ts, double b, double s) : timestamp(ts), bytes(b), seconds(s) {}
  double timestamp = 0;  // Unix seconds
  double bytes = 0;
  double seconds = 0;    // interval length
  double unique_bytes = -1;  // optional column; -1: not known
  double lost_events = 0;    // optional column
  std::vector<double> device_bytes, device_unique;  // optional columns: per Profile::devices; unique -1 = not known
};

struct Profile {
  std::vector<std::string> devices;  // the per-device optional columns, in order
  std::vector<ProfileSample> samples;
  double total_bytes() const;
  double total_seconds() const;
};

// Failure: kInvalidArgument naming the line ("profile line 7: ...").
Result<Profile> ParseProfileCsv(std::string_view text);
// The three-column form, with a header.
std::string FormatProfileCsv(const Profile& p);

}  // namespace cdp::loadgen
