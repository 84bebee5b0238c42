// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the master target's tenant lines and tenant maps:
// ParseTenantEntry / AddTenantEntry (common/daemon/daemon.h), the `tenants_file`, and
// the per-tenant keys of master-target/mt_config.cc (`tenant`, `tenant_quota`,
// `tenant_journal_compression`, `tenant_retention_lock`, `volume_retention`,
// `volume_retention_lock`, `direct_agents`) through
// MasterTargetOptionsFromConfig.
//
// Input: a selector byte, then parts joined by fuzz::kFileSeparator.
//  - selector bit 0 clear (the fast path): the tenants file, then option
//    lines, each a key letter and its value: t tenant, q tenant_quota,
//    c tenant_journal_compression, l tenant_retention_lock, r volume_retention,
//    v volume_retention_lock, d direct_agents. They are set on a variables_map
//    loaded once (tls = off), so an input costs no Boost parse.
//  - selector bit 0 set (the whole loader, as the `config` target does for the
//    process server): the config file's text, command-line flags one per line,
//    then the file at /etc/opencdp/tenants (the text names it with
//    tenants_file). LoadConfigText with the master target's options, then
//    MasterTargetOptionsFromConfig; `storage = ceph` is replaced by local (it
//    would connect to a cluster).
// Every line of the tenants file (and, on the fast path, every `tenant` value)
// also goes through ParseTenantEntry and AddTenantEntry.
//
// Properties: nothing throws out of the loaders; a parsed tenant entry has a
// valid name and a non-empty, trimmed secret, and its NAME:SECRET, NAME = SECRET
// and NAME SECRET forms parse back to it; accepted options name only
// configured tenants (and valid volume names), hold journal levels 0..19, and
// hold exactly the tenants of the `tenant` values and of the file's lines.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/log.h"
#include "common/daemon/config.h"
#include "common/daemon/daemon.h"
#include "common/env/env.h"
#include "common/wire/protocol.h"
#include "fuzz/fuzz_util.h"
#include "master-target/mt_config.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;

constexpr char kTenantsPath[] = "/etc/opencdp/tenants";

std::string_view AsText(ByteSpan b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    out.push_back(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
  }
  return out;
}

bool Blank(std::string_view line) {
  size_t first = line.find_first_not_of(" \t\r");
  return first == std::string_view::npos || line[first] == '#';
}

bool Trimmed(std::string_view s) {
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  return !s.empty() && !ws(s.front()) && !ws(s.back());
}

// One tenant line: what parses has a valid name and a trimmed, non-empty
// secret, and each of the three written forms parses back to the same pair.
void CheckEntry(std::string_view line) {
  auto e = ParseTenantEntry(line);
  if (!e.ok()) {
    Check(e.status().code() == Code::kInvalidArgument);
    return;
  }
  const auto& [name, secret] = *e;
  Check(ValidName(name) && Trimmed(secret));
  for (const char* sep : {":", " = ", " "}) {
    auto again = ParseTenantEntry(name + sep + secret);
    Check(again.ok() && again->first == name && again->second == secret);
  }
  std::map<std::string, std::string> m;
  Check(AddTenantEntry(line, &m).ok() && m.size() == 1 && m.at(name) == secret);
  Check(AddTenantEntry(line, &m).code() == Code::kInvalidArgument);  // the same tenant twice
}

// What MasterTargetOptionsFromConfig accepted, against the values it read.
void CheckOptions(const mt::MasterTargetOptions& o, const po::variables_map& vm, std::string_view tenants_file,
                  bool file_read) {
  size_t given = 0;
  if (vm.count("tenant")) given += vm["tenant"].as<std::vector<std::string>>().size();
  if (file_read) {
    for (std::string_view line : Lines(tenants_file)) {
      if (Blank(line)) continue;
      ++given;
      auto e = ParseTenantEntry(line);
      Check(e.ok() && o.tenants.count(e->first) == 1 && o.tenants.at(e->first) == e->second);
    }
  }
  Check(o.tenants.size() == given);
  for (const auto& [name, secret] : o.tenants) Check(ValidName(name) && Trimmed(secret));
  for (const auto& [name, bytes] : o.tenant_quota_bytes) Check(o.tenants.count(name) == 1);
  for (const auto& [name, level] : o.tenant_journal_zstd_level) Check(o.tenants.count(name) == 1 && level >= 0 && level <= 19);
  for (const auto& [name, us] : o.tenant_lock_us) Check(o.tenants.count(name) == 1);
  for (const auto* per_volume : {&o.volume_max_age_us, &o.volume_lock_us}) {
    for (const auto& [key, us] : *per_volume) {
      const size_t slash = key.find('/');
      Check(slash != std::string::npos && o.tenants.count(key.substr(0, slash)) == 1 &&
            ValidName(key.substr(slash + 1)));
    }
  }
  for (const std::string& t : o.direct_agent_tenants) Check(ValidName(t));
  Check(o.journal_zstd_level >= 0 && o.journal_zstd_level <= 19);
}

// The variables_map the fast path starts from: every key at its default.
const po::variables_map& BaseVars() {
  static const po::variables_map* vars = [] {
    const char* argv[] = {"cdp-master-target"};
    auto loaded = LoadConfigText(1, argv, mt::MasterTargetConfigDescription(), "tls = off\nnbd_tls = off\n", "base.conf");
    Check(loaded.ok());
    return new po::variables_map(loaded->vars);
  }();
  return *vars;
}

void Set(po::variables_map& vm, const std::string& key, boost::any value) {
  std::map<std::string, po::variable_value>& m = vm;
  m[key] = po::variable_value(std::move(value), false);
}

void FastPath(const std::vector<ByteSpan>& parts) {
  static const std::map<char, std::string> kKeys = {
      {'t', "tenant"},           {'q', "tenant_quota"},          {'c', "tenant_journal_compression"},
      {'l', "tenant_retention_lock"}, {'r', "volume_retention"}, {'v', "volume_retention_lock"},
      {'d', "direct_agents"}};
  po::variables_map vm = BaseVars();
  std::map<std::string, std::vector<std::string>> lists;
  if (parts.size() > 1) {
    size_t n = 0;
    for (std::string_view line : Lines(AsText(parts[1]))) {
      if (line.empty() || ++n > 64) continue;
      auto k = kKeys.find(line[0]);
      if (k != kKeys.end()) lists[k->second].emplace_back(line.substr(1));
    }
  }
  for (const std::string& t : lists["tenant"]) CheckEntry(t);
  for (auto& [key, values] : lists) Set(vm, key, std::move(values));
  std::unique_ptr<Env> env = NewMemEnv();
  const std::string_view file = AsText(parts[0]);
  for (std::string_view line : Lines(file)) CheckEntry(line);
  const bool with_file = !file.empty();
  if (with_file) {
    Check(env->CreateDirs("/etc/opencdp").ok());
    Check(WriteFileAtomic(env.get(), kTenantsPath, parts[0]).ok());
    Set(vm, "tenants_file", std::string(kTenantsPath));
  }
  auto o = mt::MasterTargetOptionsFromConfig(vm, env.get());
  if (!o.ok()) {
    Check(o.status().code() == Code::kInvalidArgument);
    return;
  }
  CheckOptions(*o, vm, file, with_file);
}

void WholeLoader(const std::vector<ByteSpan>& parts) {
  static const po::options_description* desc = new po::options_description(mt::MasterTargetConfigDescription());
  std::vector<std::string> args{"cdp-master-target"};
  if (parts.size() > 1) {
    for (std::string_view line : Lines(AsText(parts[1]))) {
      if (args.size() >= 32) break;
      args.emplace_back(line);
    }
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  Result<LoadedConfig> loaded = LoadConfigText(int(argv.size()), argv.data(), *desc, AsText(parts[0]), "mt.conf");
  if (!loaded.ok() || loaded->Answer() != nullptr) return;
  po::variables_map& vm = loaded->vars;
  if (vm["storage"].as<std::string>() == "ceph") Set(vm, "storage", std::string("local"));
  std::unique_ptr<Env> env = NewMemEnv();
  const std::string_view file = parts.size() > 2 ? AsText(parts[2]) : std::string_view();
  for (std::string_view line : Lines(file)) CheckEntry(line);
  if (parts.size() > 2) {
    Check(env->CreateDirs("/etc/opencdp").ok());
    Check(WriteFileAtomic(env.get(), kTenantsPath, parts[2]).ok());
  }
  log::Options lo;
  auto o = mt::MasterTargetOptionsFromConfig(vm, env.get(), &lo);
  if (!o.ok()) return;  // any code: a missing tenants file is kNotFound
  const bool file_read = vm.count("tenants_file") == 1;
  if (file_read) {
    // It was read, so it is ours (the only file in the Env).
    Check(vm["tenants_file"].as<std::string>() != "" && parts.size() > 2);
  }
  CheckOptions(*o, vm, file, file_read);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<ByteSpan> parts = fuzz::SplitFiles(ByteSpan(data + 1, size - 1), 3);
  if ((data[0] & 1) == 0) {
    FastPath(parts);
  } else {
    WholeLoader(parts);
  }
  return 0;
}
