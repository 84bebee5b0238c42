// SPDX-License-Identifier: Apache-2.0
// Flags of the C++ benchmarks under bench/: `--name VALUE` or `--name=VALUE`.
//
//   for (int i = 1; i < argc; ++i) {
//     if (const char* v = bench::FlagValue(argc, argv, &i, "dir")) cfg.dir = v;
//     else ... usage
//   }
#pragma once

#include <string>

namespace cdp::bench {

// The value of flag `name` if argv[*i] is it (for `--name VALUE`, *i moves
// onto VALUE); otherwise null and *i unchanged.
inline const char* FlagValue(int argc, char** argv, int* i, const char* name) {
  const std::string a = argv[*i];
  const std::string p = std::string("--") + name;
  if (a == p && *i + 1 < argc) return argv[++*i];
  if (a.rfind(p + "=", 0) == 0) return argv[*i] + p.size() + 1;
  return nullptr;
}

}  // namespace cdp::bench
