// SPDX-License-Identifier: Apache-2.0
// Log: named spdlog loggers, one per component ("agent", "ps.spool", "sqlite").
//
//   auto log = cdp::log::Get("agent");
//   log->info("{} write batch acked, {} bytes", cdp::log::Where{vol, peer, seq}, n);
//   // 2026-11-21T22:31:07.123Z info  [agent] vol=db1 peer=10.0.0.2:7400 seq=42 write batch acked, 4096 bytes
//
// Every line carries UTC time (ms), level and logger name. Lines about a volume
// name it, its peer and the sequence number through Where (DESIGN.md: "every
// line names its volume, peer and sequence number").
//
// Level: Init() sets it from Options::level when non-empty, otherwise from the
// environment variable CDP_LOG_LEVEL, otherwise "info". Levels: trace, debug,
// info, warn (or warning), error, critical, off.
//
// State: loggers live in spdlog's process-wide registry (that is what makes
// Get("x") return the same logger everywhere); this module keeps no state of
// its own. Until Init() is called, loggers write to stderr at level info, or
// CDP_LOG_LEVEL if set.
//
// Flushing: a warning or worse is written through at once; every line at
// least once a second (a thread of spdlog's flushes every logger), so a
// crash loses at most about a second of lines.
//
// Thread safety: Get() and every logger are thread-safe. Init() replaces the
// sinks of existing loggers: call it at start-up, before other threads log.
#pragma once

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp::log {

// "%Y-%m-%dT%H:%M:%S.%eZ %-5l [%n] %v", rendered in UTC.
inline constexpr const char* kDefaultPattern = "%Y-%m-%dT%H:%M:%S.%eZ %-5l [%n] %v";

struct Options {
  std::string level;                    // "" = CDP_LOG_LEVEL or "info"
  std::string pattern = kDefaultPattern;  // spdlog pattern, time in UTC
  std::string file;                     // "" = stderr; else appended to this file
                                        // (spdlog opens it itself, not through cdp::Env)
};

// Configures every existing and future logger: level, pattern, sink.
// Failure: kInvalidArgument for an unknown level, kIOError if the file cannot be opened.
// Call at start-up (after LoadConfig); safe to call again (e.g. tests).
Status Init(const Options& opts);

// The logger named `name`, created on first use with the current sink, level
// and pattern. Never null. The name should be a short component name.
std::shared_ptr<spdlog::logger> Get(std::string_view name);

// "debug" -> spdlog::level::debug. Failure: kInvalidArgument naming the text.
Result<spdlog::level::level_enum> ParseLevel(std::string_view text);

// The context of a log line. Formats as "vol=<volume> peer=<peer> seq=<seq>",
// leaving out empty fields (seq 0 = no sequence; sequences start at 1).
// Holds views: the strings must outlive the formatting call (one log line).
struct Where {
  std::string_view volume;
  std::string_view peer;
  uint64_t seq = 0;
};

// Renders `w` as above ("" when all fields are empty).
std::string ToString(const Where& w);

}  // namespace cdp::log

template <>
struct fmt::formatter<cdp::log::Where> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(const cdp::log::Where& w, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(cdp::log::ToString(w), ctx);
  }
};
