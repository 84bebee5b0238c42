// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the fuzz targets (fuzz/README.md). Not part of any daemon.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "common/base/coding.h"

namespace cdp::fuzz {

// Inputs that stand for several files separate them with this marker; the
// seed generator (fuzz/seeds.cc) joins files with it.
inline constexpr std::string_view kFileSeparator = "\n--CDPFILE--\n";

// Splits `in` at every kFileSeparator (at most `max_files` pieces; the last
// keeps the rest).
inline std::vector<ByteSpan> SplitFiles(ByteSpan in, size_t max_files) {
  std::vector<ByteSpan> out;
  std::string_view s(reinterpret_cast<const char*>(in.data()), in.size());
  size_t pos = 0;
  while (out.size() + 1 < max_files) {
    size_t at = s.find(kFileSeparator, pos);
    if (at == std::string_view::npos) break;
    out.push_back(in.subspan(pos, at - pos));
    pos = at + kFileSeparator.size();
  }
  out.push_back(in.subspan(pos));
  return out;
}

inline Bytes JoinFiles(const std::vector<Bytes>& files) {
  Bytes out;
  for (size_t i = 0; i < files.size(); ++i) {
    if (i > 0) out.insert(out.end(), kFileSeparator.begin(), kFileSeparator.end());
    out.insert(out.end(), files[i].begin(), files[i].end());
  }
  return out;
}

// A broken property: says which (file and line of the call) and abort()s, so
// that libFuzzer reports and saves the input.
inline void Check(bool ok, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: property broken at %s:%d\n", file, line);
  std::abort();
}

}  // namespace cdp::fuzz
