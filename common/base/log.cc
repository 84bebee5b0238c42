// SPDX-License-Identifier: Apache-2.0
#include "common/base/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <chrono>
#include <cstdlib>
#include <vector>

namespace cdp::log {

Result<spdlog::level::level_enum> ParseLevel(std::string_view text) {
  using L = spdlog::level::level_enum;
  static constexpr std::pair<std::string_view, L> kLevels[] = {
      {"trace", L::trace}, {"debug", L::debug},       {"info", L::info},         {"warn", L::warn},
      {"warning", L::warn}, {"error", L::err},        {"err", L::err},           {"critical", L::critical},
      {"off", L::off}};
  for (const auto& [name, level] : kLevels) {
    if (name == text) return level;
  }
  return Status::InvalidArgument("unknown log level '" + std::string(text) +
                                 "' (trace, debug, info, warn, error, critical, off)");
}

namespace {

// The name of the default logger Init() installs; its presence means Init() ran.
constexpr const char* kDefaultLoggerName = "cdp";

// The level used when Options::level is empty: CDP_LOG_LEVEL, else info.
Result<spdlog::level::level_enum> EnvLevel() {
  const char* env = std::getenv("CDP_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return spdlog::level::info;
  auto r = ParseLevel(env);
  if (!r.ok()) return r.status().WithContext("CDP_LOG_LEVEL");
  return r;
}

// spdlog's default logger carries the sinks every named logger shares.
std::vector<spdlog::sink_ptr> CurrentSinks() {
  auto def = spdlog::default_logger();
  if (def) return def->sinks();
  return {std::make_shared<spdlog::sinks::stderr_sink_mt>()};
}

}  // namespace

Status Init(const Options& opts) {
  spdlog::level::level_enum level;
  if (!opts.level.empty()) {
    auto r = ParseLevel(opts.level);
    if (!r.ok()) return r.status();
    level = *r;
  } else {
    auto r = EnvLevel();
    if (!r.ok()) return r.status();
    level = *r;
  }
  spdlog::sink_ptr sink;
  if (opts.file.empty()) {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  } else {
    // The log names tenants, volumes and peers: created 0600 (spdlog's
    // fopen would make it 0666 less the umask).
    if (int fd = ::open(opts.file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600); fd >= 0) ::close(fd);
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(opts.file, /*truncate=*/false);
    } catch (const spdlog::spdlog_ex& e) {
      return Status::IOError("log file " + opts.file + ": " + e.what());
    }
  }
  auto def = std::make_shared<spdlog::logger>(kDefaultLoggerName, sink);
  spdlog::set_default_logger(def);
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) {
    l->sinks().clear();
    l->sinks().push_back(sink);
  });
  spdlog::set_pattern(opts.pattern.empty() ? kDefaultPattern : opts.pattern, spdlog::pattern_time_type::utc);
  spdlog::set_level(level);
  // Warnings at once; everything else at least once a second (spdlog's
  // periodic flusher), so a kill -9 loses at most about a second of lines.
  spdlog::flush_on(spdlog::level::warn);
  spdlog::flush_every(std::chrono::seconds(1));
  return Status::OK();
}

std::shared_ptr<spdlog::logger> Get(std::string_view name) {
  std::string n(name);
  if (auto l = spdlog::get(n)) return l;
  auto def = spdlog::default_logger();
  if (def == nullptr || def->name() != kDefaultLoggerName) {
    // Init() was not called: stderr, the default pattern, the level from the
    // environment (info if CDP_LOG_LEVEL is not a level).
    Options o;
    if (!Init(o).ok()) {
      o.level = "info";
      (void)Init(o);
    }
  }
  auto sinks = CurrentSinks();
  auto logger = std::make_shared<spdlog::logger>(n, sinks.begin(), sinks.end());
  try {
    spdlog::initialize_logger(logger);  // applies the registry's level and pattern, registers
  } catch (const spdlog::spdlog_ex&) {
    // Another thread registered the same name first; use that one.
  }
  if (auto l = spdlog::get(n)) return l;
  return logger;
}

std::string ToString(const Where& w) {
  std::string out;
  auto add = [&](std::string_view key, std::string_view value) {
    if (!out.empty()) out += ' ';
    out += key;
    out += '=';
    out += value;
  };
  if (!w.volume.empty()) add("vol", w.volume);
  if (!w.peer.empty()) add("peer", w.peer);
  if (w.seq != 0) add("seq", std::to_string(w.seq));
  return out;
}

}  // namespace cdp::log
