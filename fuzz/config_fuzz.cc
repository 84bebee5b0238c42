// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the daemons' configuration loading (common/daemon/config.h),
// with the process server's real option set (process-server/ps_config.h).
//
// Input: the config file's text; after an optional kFileSeparator, command-line
// flags, one per line. They go through LoadConfigText (INI parsing, sections,
// quotes, duplicate keys, Boost.Program_options with the ByteSize and Duration
// validators) and, when that succeeds, OptionsFromConfig (host:port, tenants,
// codecs, throttle schedules, TLS and connection caps) exactly as main() does.
// The text is also given to ParseByteSize and ParseDuration directly.
//
// Properties: nothing throws out of the loaders (an escaping exception is a
// crash here); a size or duration that parses formats back to text that parses
// to the same value.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/daemon/config.h"
#include "fuzz/fuzz_util.h"
#include "process-server/ps_config.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;

std::string_view AsText(ByteSpan b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const po::options_description* desc = new po::options_description(ps::ProcessServerConfigDescription());
  std::vector<ByteSpan> parts = fuzz::SplitFiles(ByteSpan(data, size), 2);
  std::string_view file_text = AsText(parts[0]);

  std::vector<std::string> args{"cdp-process-server"};
  if (parts.size() > 1) {
    std::string_view flags = AsText(parts[1]);
    while (!flags.empty() && args.size() < 32) {
      size_t nl = flags.find('\n');
      args.emplace_back(flags.substr(0, nl));
      flags.remove_prefix(nl == std::string_view::npos ? flags.size() : nl + 1);
    }
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());

  Result<LoadedConfig> loaded = LoadConfigText(int(argv.size()), argv.data(), *desc, file_text, "fuzz.conf");
  if (loaded.ok() && loaded->Answer() == nullptr) {
    log::Options lo;
    (void)ps::OptionsFromConfig(loaded->vars, &lo);
  }

  if (size <= 64) {
    if (auto b = ParseByteSize(file_text); b.ok()) {
      auto again = ParseByteSize(FormatByteSize(*b));
      Check(again.ok() && *again == *b);
    }
    if (auto d = ParseDuration(file_text); d.ok()) {
      auto again = ParseDuration(FormatDuration(*d));
      Check(again.ok() && *again == *d);
    }
  }
  return 0;
}
