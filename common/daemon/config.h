// SPDX-License-Identifier: Apache-2.0
// Config: the one start-up configuration loader of every OpenCDP daemon.
//
// A daemon describes its options with Boost.Program_options, then calls
// LoadConfig(). Sources, lowest precedence first:
//   1. defaults declared in the options_description;
//   2. an INI-style file named by `--config FILE`:
//        # comment            ; comment
//        port = 9100
//        [log]                 keys below are "log.<key>"
//        level = debug         -> option "log.level"
//      Values may be wrapped in double quotes (stripped). Only whole-line
//      comments exist, so a value may contain '#' or ';'.
//   3. command-line flags (`--port 9101`, `--port=9101`), which override the file.
//
// Errors (Status kInvalidArgument; the message names what is wrong):
//   unknown key in the file   "unknown key 'prot' in /etc/cdp/agent.conf:3"
//   unknown flag              "unknown option '--prot'"
//   positional argument       "unexpected argument 'extra'"
//   bad value in the file     "bad value 'abc' for 'port' in /etc/cdp/agent.conf:4: ..."
//   bad value of a flag       "bad value 'abc' for '--port': ..."
//   a key set twice in a file (unless the option is multi-valued), a line that
//   is not `key = value`, `--config` without a readable file, a missing
//   required option.
// Exceptions of Boost.Program_options are caught inside; LoadConfig never throws
// for bad input.
//
// `--help` (or `-h`) is built in: LoadConfig then returns a LoadedConfig with
// help == true and help_text holding the usage and every option; the daemon
// prints it and exits 0. `--version` likewise: version == true, and the daemon
// prints version_text and exits 0.
//
// Sizes and durations: declare options as po::value<cdp::ByteSize>() or
// po::value<cdp::Duration>() to accept "64MiB", "1G", "5s", "15m" in files and
// flags; the same parsers are available as ParseByteSize()/ParseDuration().
//
// Thread safety: functions here are pure; call them at start-up.
#pragma once

#include <boost/any.hpp>
#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/host_port.h"
#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp {

class Env;
namespace po = boost::program_options;

// A byte count. Syntax: a non-negative number with an optional fraction and
// an optional unit, no space or one space between:
//   (none) or B            bytes
//   K, KiB, M, MiB, G, GiB, T, TiB, P, PiB    powers of 1024 (k, m, g, t, p too)
//   KB, MB, GB, TB, PB                         powers of 1000
// "64MiB" = 67108864, "1G" = 1073741824, "1.5K" = 1536, "10MB" = 10000000.
// A fractional result is rounded down to a whole byte. Overflow of uint64 is an error.
struct ByteSize {
  uint64_t bytes = 0;
  bool operator==(const ByteSize&) const = default;
};

// A time span in microseconds (the unit of cdp::Clock). Syntax: one or more
// number+unit pairs, units us, ms, s, m (minutes), h, d: "250ms", "5s",
// "15m", "1h30m", "1.5s". A bare number without a unit is an error (ambiguous).
struct Duration {
  uint64_t micros = 0;
  uint64_t millis() const { return micros / 1000; }
  uint64_t seconds() const { return micros / 1000000; }
  bool operator==(const Duration&) const = default;
};

// Parse the syntax above. Failure: kInvalidArgument naming the text.
Result<ByteSize> ParseByteSize(std::string_view text);
Result<Duration> ParseDuration(std::string_view text);
// "64MiB"-style rendering (exact when the value is a whole multiple of a unit,
// else bytes), and "1h30m"-style rendering; both parse back to the same value.
std::string FormatByteSize(ByteSize size);
std::string FormatDuration(Duration d);

// Hooks for Boost.Program_options so po::value<ByteSize>() / po::value<Duration>() work.
void validate(boost::any& v, const std::vector<std::string>& values, ByteSize*, int);
void validate(boost::any& v, const std::vector<std::string>& values, Duration*, int);
std::ostream& operator<<(std::ostream& os, const ByteSize& s);  // for default_value display
std::ostream& operator<<(std::ostream& os, const Duration& d);

// The address under `key` (a std::string option), parsed by common/base/host_port.h.
// Failure: kInvalidArgument "'key': bad address ...".
Result<HostPort> GetHostPort(const po::variables_map& vars, const std::string& key, const HostPort::Rules& rules);

struct ConfigOptions {
  // Name shown in the usage line of --help, e.g. "cdp-agent".
  std::string program = "opencdp";
  // One-line description printed under the usage line.
  std::string summary;
  // Reads the --config file. nullptr = DefaultEnv(). Must outlive the call.
  Env* env = nullptr;
  // A file to read when no --config flag is given ("" = none). A missing
  // default file is not an error; a missing --config file is.
  std::string default_config_path;
};

struct LoadedConfig {
  po::variables_map vars;     // every option's value, after notify()
  bool help = false;          // --help was given: print help_text, exit 0
  std::string help_text;      // always filled
  bool version = false;       // --version was given: print version_text, exit 0
  std::string version_text;   // "PROGRAM 0.1.0 (git REV)\n" (common/base/version.h), once parsed

  // What to print before exiting 0 when --help or --version was given; nullptr
  // otherwise (then run). Points into this object.
  const std::string* Answer() const { return help ? &help_text : version ? &version_text : nullptr; }
  std::string config_path;    // the file that was read, "" if none
};

// Loads defaults, then the file, then `argv` (argv[0] is the program name and is
// skipped). `desc` is the daemon's options; "--config", "--help" and "--version" are added by
// the loader and must not be in `desc`. Option names in `desc` for keys inside
// a [section] are "section.key" (e.g. "log.level").
// Success: the merged values. Failure: kInvalidArgument as described above.
Result<LoadedConfig> LoadConfig(int argc, const char* const* argv, const po::options_description& desc,
                                const ConfigOptions& opts = {});

// The same, with the file contents given as text (`source_name` is used in
// messages as the file name). For tests and for configs that arrive over the wire.
// A --config flag in `argv` is an error here (the file is already given).
Result<LoadedConfig> LoadConfigText(int argc, const char* const* argv, const po::options_description& desc,
                                    std::string_view file_text, std::string_view source_name,
                                    const ConfigOptions& opts = {});

}  // namespace cdp
