// SPDX-License-Identifier: Apache-2.0
#include "common/daemon/config.h"

#include <algorithm>

#include <cctype>
#include <limits>
#include <map>
#include <sstream>

#include "common/base/version.h"
#include "common/env/env.h"

namespace cdp {

namespace {

using u128 = unsigned __int128;
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A decimal number "12" or "1.25" at the front of `s` (consumed): value = whole + num/den.
struct Decimal {
  u128 whole = 0;
  u128 num = 0;
  u128 den = 1;
};

bool ConsumeDecimal(std::string_view& s, Decimal* d) {
  size_t i = 0;
  bool digits = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    d->whole = d->whole * 10 + u128(s[i] - '0');
    if (d->whole > kU64Max) return false;
    digits = true;
    ++i;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    int frac = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      if (frac < 18) {  // further digits are below any unit's resolution
        d->num = d->num * 10 + u128(s[i] - '0');
        d->den *= 10;
        ++frac;
      }
      digits = true;
      ++i;
    }
  }
  if (!digits) return false;
  s.remove_prefix(i);
  return true;
}

// whole*mult + num*mult/den, or false on overflow of uint64.
bool Scale(const Decimal& d, uint64_t mult, uint64_t* out) {
  u128 v = d.whole * mult;  // whole <= 2^64, mult <= 2^60: fits
  v += d.num * mult / d.den;
  if (v > kU64Max) return false;
  *out = uint64_t(v);
  return true;
}

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

// One `key = value` line of a config file.
struct Entry {
  std::string key;
  std::string value;
  int line = 0;
};

Result<std::vector<Entry>> ParseIni(std::string_view text, const std::string& source) {
  std::vector<Entry> out;
  std::string section;
  int line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    std::string where = source + ":" + std::to_string(line_no);
    if (line[0] == '[') {
      if (line.back() != ']') return Status::InvalidArgument("malformed section header in " + where);
      std::string_view name = Trim(line.substr(1, line.size() - 2));
      if (name.empty()) return Status::InvalidArgument("empty section name in " + where);
      section = std::string(name);
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument("expected 'key = value' in " + where + ", got " + Quote(line));
    }
    std::string_view key = Trim(line.substr(0, eq));
    std::string_view value = Trim(line.substr(eq + 1));
    if (key.empty()) return Status::InvalidArgument("missing key before '=' in " + where);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    Entry e;
    e.key = section.empty() ? std::string(key) : section + "." + std::string(key);
    e.value = std::string(value);
    e.line = line_no;
    out.push_back(std::move(e));
  }
  return out;
}

// Runs the option's own parser on `value` to report a bad value with its
// origin, before the values are stored.
Status CheckValue(const po::option_description& d, const std::vector<std::string>& tokens, const std::string& display,
                  const std::string& origin) {
  std::string shown = tokens.empty() ? std::string() : tokens.front();
  try {
    boost::any tmp;
    d.semantic()->parse(tmp, tokens, true);
  } catch (po::error_with_option_name& e) {
    e.set_option_name(display);
    // Boost replaces %value% (and its other placeholders) in its message
    // until none is left: a value holding "%value%" made what() loop
    // forever (found by fuzz.config). The value is quoted by us above; Boost
    // gets it without '%'.
    std::string safe = shown;
    std::replace(safe.begin(), safe.end(), '%', '?');
    e.set_substitute("value", safe);
    e.set_substitute("original_token", safe);
    return Status::InvalidArgument("bad value " + Quote(shown) + " for " + Quote(display) + origin + ": " + e.what());
  } catch (const std::exception& e) {
    return Status::InvalidArgument("bad value " + Quote(shown) + " for " + Quote(display) + origin + ": " + e.what());
  }
  return Status::OK();
}

// The error of a command line Boost refused with a placeholder-bearing
// message: the same line parsed again with '%' replaced by '?', so that
// what() terminates (see Load).
Status CommandLineError(int argc, const char* const* argv, const po::options_description& all) {
  std::vector<std::string> safe(argv, argv + argc);
  for (std::string& t : safe) std::replace(t.begin(), t.end(), '%', '?');
  std::vector<const char*> ptrs;
  for (const std::string& t : safe) ptrs.push_back(t.c_str());
  try {
    (void)po::command_line_parser(argc, const_cast<char**>(ptrs.data())).options(all).run();
  } catch (const po::unknown_option& e) {
    return Status::InvalidArgument("unknown option " + Quote(e.get_option_name()));
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("command line: ") + e.what());
  }
  return Status::InvalidArgument("command line: a malformed option (its '%' shown as '?' does not recur)");
}

bool MultiValued(const po::option_description& d) {
  return d.semantic()->is_composing() || d.semantic()->max_tokens() > 1;
}

// The shared loader: `file_reader` returns the file text (or nullopt when there is none).
struct FileSource {
  bool present = false;
  std::string text;
  std::string name;
};

Result<LoadedConfig> Load(int argc, const char* const* argv, const po::options_description& desc,
                          const ConfigOptions& opts, bool text_given, FileSource given) {
  LoadedConfig out;
  po::options_description generic("Generic options");
  generic.add_options()("help,h", "print this help and exit")("version", "print the version and exit")(
      "config", po::value<std::string>()->value_name("FILE"), "read options from FILE (INI: key = value, [section])");
  po::options_description all;
  try {
    all.add(desc).add(generic);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("bad option description: ") + e.what());
  }
  {
    std::ostringstream help;
    help << "Usage: " << opts.program << " [options]\n";
    if (!opts.summary.empty()) help << opts.summary << "\n";
    help << "\n" << all;
    out.help_text = help.str();
  }

  // 1. The command line: syntax, unknown flags, bad values.
  po::parsed_options cmdline(&all);
  try {
    cmdline = po::command_line_parser(argc, const_cast<char**>(argv)).options(all).run();
  } catch (const po::unknown_option& e) {
    return Status::InvalidArgument("unknown option " + Quote(e.get_option_name()));
  } catch (const po::error_with_option_name&) {
    // Boost replaces %placeholders% in its message until none is left, and an
    // argument holding one ("--t=%original_token%", an ambiguous option)
    // made what() loop forever, growing (found by fuzz/mt_tenants). The
    // message comes from the same arguments with every '%' as '?'.
    return CommandLineError(argc, argv, all);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("command line: ") + e.what());
  }
  for (const po::option& o : cmdline.options) {
    if (o.string_key.empty()) {
      // Daemons take no positional arguments.
      std::string token = o.original_tokens.empty() ? std::string() : o.original_tokens.front();
      return Status::InvalidArgument("unexpected argument " + Quote(token));
    }
    const po::option_description* d = all.find_nothrow(o.string_key, false);
    if (d == nullptr) return Status::InvalidArgument("unknown option " + Quote("--" + o.string_key));
    CDP_RETURN_IF_ERROR(CheckValue(*d, o.value, "--" + o.string_key, ""));
  }
  try {
    po::store(cmdline, out.vars);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("command line: ") + e.what());
  }
  out.version_text = VersionText(opts.program);
  if (out.vars.count("help")) {
    out.help = true;
    return out;
  }
  if (out.vars.count("version")) {
    out.version = true;
    return out;
  }

  // 2. The config file.
  FileSource file = std::move(given);
  if (out.vars.count("config")) {
    if (text_given) return Status::InvalidArgument("--config is not allowed here: the config text is given");
    file.name = out.vars["config"].as<std::string>();
    Env* env = opts.env != nullptr ? opts.env : DefaultEnv();
    auto data = ReadWholeFile(env, file.name);
    if (!data.ok()) return data.status().WithContext("config file " + file.name);
    file.text.assign(data->begin(), data->end());
    file.present = true;
  } else if (!text_given && !opts.default_config_path.empty()) {
    Env* env = opts.env != nullptr ? opts.env : DefaultEnv();
    if (env->Exists(opts.default_config_path)) {
      file.name = opts.default_config_path;
      auto data = ReadWholeFile(env, file.name);
      if (!data.ok()) return data.status().WithContext("config file " + file.name);
      file.text.assign(data->begin(), data->end());
      file.present = true;
    }
  }
  if (file.present) {
    out.config_path = file.name;
    auto entries = ParseIni(file.text, file.name);
    if (!entries.ok()) return entries.status();
    po::parsed_options parsed(&all);
    std::map<std::string, int> seen;
    for (const Entry& e : *entries) {
      std::string where = " in " + file.name + ":" + std::to_string(e.line);
      const po::option_description* d = all.find_nothrow(e.key, false);
      if (d == nullptr || e.key == "config" || e.key == "help" || e.key == "version") {
        return Status::InvalidArgument("unknown key " + Quote(e.key) + where);
      }
      auto [it, fresh] = seen.emplace(e.key, e.line);
      if (!fresh && !MultiValued(*d)) {
        return Status::InvalidArgument("key " + Quote(e.key) + " set twice in " + file.name + " (lines " +
                                       std::to_string(it->second) + " and " + std::to_string(e.line) + ")");
      }
      CDP_RETURN_IF_ERROR(CheckValue(*d, {e.value}, e.key, where));
      po::option o;
      o.string_key = e.key;
      o.value.push_back(e.value);
      o.original_tokens = {e.key, e.value};
      parsed.options.push_back(std::move(o));
    }
    try {
      po::store(parsed, out.vars);  // keys already set on the command line keep the flag's value
    } catch (const std::exception& e) {
      return Status::InvalidArgument("config file " + file.name + ": " + e.what());
    }
  }

  // 3. Required options and notifiers.
  try {
    po::notify(out.vars);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(e.what());
  }
  return out;
}

}  // namespace

Result<ByteSize> ParseByteSize(std::string_view text) {
  std::string_view s = Trim(text);
  Decimal d;
  if (!ConsumeDecimal(s, &d)) return Status::InvalidArgument("bad size " + Quote(text) + ": expected a number");
  if (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  struct Unit {
    std::string_view name;
    uint64_t mult;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"B", 1},
      {"K", 1ULL << 10},
      {"k", 1ULL << 10},
      {"KiB", 1ULL << 10},
      {"KB", 1000ULL},
      {"kB", 1000ULL},
      {"M", 1ULL << 20},
      {"m", 1ULL << 20},
      {"MiB", 1ULL << 20},
      {"MB", 1000ULL * 1000},
      {"G", 1ULL << 30},
      {"g", 1ULL << 30},
      {"GiB", 1ULL << 30},
      {"GB", 1000ULL * 1000 * 1000},
      {"T", 1ULL << 40},
      {"t", 1ULL << 40},
      {"TiB", 1ULL << 40},
      {"TB", 1000ULL * 1000 * 1000 * 1000},
      {"P", 1ULL << 50},
      {"p", 1ULL << 50},
      {"PiB", 1ULL << 50},
      {"PB", 1000ULL * 1000 * 1000 * 1000 * 1000},
  };
  for (const Unit& u : kUnits) {
    if (u.name != s) continue;
    ByteSize out;
    if (!Scale(d, u.mult, &out.bytes)) return Status::InvalidArgument("size " + Quote(text) + " is too large");
    return out;
  }
  return Status::InvalidArgument("bad size " + Quote(text) + ": unknown unit " + Quote(s) +
                                 " (B, K/KiB, M/MiB, G/GiB, T/TiB, P/PiB, KB, MB, GB, TB, PB)");
}

Result<Duration> ParseDuration(std::string_view text) {
  std::string_view s = Trim(text);
  if (s.empty()) return Status::InvalidArgument("bad duration '': empty");
  uint64_t total = 0;
  while (!s.empty()) {
    Decimal d;
    if (!ConsumeDecimal(s, &d)) {
      return Status::InvalidArgument("bad duration " + Quote(text) + ": expected a number at " + Quote(s));
    }
    size_t n = 0;
    while (n < s.size() && std::isalpha(static_cast<unsigned char>(s[n]))) ++n;
    std::string_view unit = s.substr(0, n);
    s.remove_prefix(n);
    uint64_t mult = 0;
    if (unit == "us") {
      mult = 1;
    } else if (unit == "ms") {
      mult = 1000;
    } else if (unit == "s") {
      mult = 1000000;
    } else if (unit == "m") {
      mult = 60ULL * 1000000;
    } else if (unit == "h") {
      mult = 3600ULL * 1000000;
    } else if (unit == "d") {
      mult = 86400ULL * 1000000;
    } else if (unit.empty()) {
      return Status::InvalidArgument("bad duration " + Quote(text) + ": a unit is required (us, ms, s, m, h, d)");
    } else {
      return Status::InvalidArgument("bad duration " + Quote(text) + ": unknown unit " + Quote(unit) +
                                     " (us, ms, s, m, h, d)");
    }
    uint64_t part = 0;
    if (!Scale(d, mult, &part) || part > kU64Max - total) {
      return Status::InvalidArgument("duration " + Quote(text) + " is too large");
    }
    total += part;
  }
  return Duration{total};
}

std::string FormatByteSize(ByteSize size) {
  static constexpr std::pair<const char*, int> kUnits[] = {{"PiB", 50}, {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}};
  if (size.bytes != 0) {
    for (const auto& [name, shift] : kUnits) {
      uint64_t m = 1ULL << shift;
      if (size.bytes % m == 0) return std::to_string(size.bytes / m) + name;
    }
  }
  return std::to_string(size.bytes) + "B";
}

std::string FormatDuration(Duration d) {
  if (d.micros == 0) return "0s";
  static constexpr std::pair<const char*, uint64_t> kUnits[] = {
      {"d", 86400ULL * 1000000}, {"h", 3600ULL * 1000000}, {"m", 60ULL * 1000000},
      {"s", 1000000},            {"ms", 1000},             {"us", 1}};
  std::string out;
  uint64_t left = d.micros;
  for (const auto& [name, mult] : kUnits) {
    if (left >= mult) {
      out += std::to_string(left / mult) + name;
      left %= mult;
    }
  }
  return out;
}

void validate(boost::any& v, const std::vector<std::string>& values, ByteSize*, int) {
  po::validators::check_first_occurrence(v);
  const std::string& s = po::validators::get_single_string(values);
  auto r = ParseByteSize(s);
  if (!r.ok()) throw po::error_with_option_name(r.status().message());
  v = *r;
}

void validate(boost::any& v, const std::vector<std::string>& values, Duration*, int) {
  po::validators::check_first_occurrence(v);
  const std::string& s = po::validators::get_single_string(values);
  auto r = ParseDuration(s);
  if (!r.ok()) throw po::error_with_option_name(r.status().message());
  v = *r;
}

std::ostream& operator<<(std::ostream& os, const ByteSize& s) { return os << FormatByteSize(s); }
std::ostream& operator<<(std::ostream& os, const Duration& d) { return os << FormatDuration(d); }

Result<HostPort> GetHostPort(const po::variables_map& vars, const std::string& key, const HostPort::Rules& rules) {
  auto hp = ParseHostPort(vars[key].as<std::string>(), rules);
  if (!hp.ok()) return hp.status().WithContext("'" + key + "'");
  return hp;
}

Result<LoadedConfig> LoadConfig(int argc, const char* const* argv, const po::options_description& desc,
                                const ConfigOptions& opts) {
  return Load(argc, argv, desc, opts, /*text_given=*/false, FileSource{});
}

Result<LoadedConfig> LoadConfigText(int argc, const char* const* argv, const po::options_description& desc,
                                    std::string_view file_text, std::string_view source_name,
                                    const ConfigOptions& opts) {
  FileSource f;
  f.present = true;
  f.text = std::string(file_text);
  f.name = std::string(source_name);
  return Load(argc, argv, desc, opts, /*text_given=*/true, std::move(f));
}

}  // namespace cdp
