// SPDX-License-Identifier: Apache-2.0
#include "agent/site_state.h"

#include <charconv>

namespace cdp::agent {

namespace {

constexpr std::string_view kMagic = "opencdp-site 1";

Status Bad(const std::string& path, const std::string& why) {
  return Status::Corruption(path + ": " + why + " (expected \"" + std::string(kMagic) +
                            "\", \"generation N\", \"phase NAME\" lines)");
}

}  // namespace

std::string_view SitePhaseName(SitePhase p) {
  switch (p) {
    case SitePhase::kProtecting: return "protecting";
    case SitePhase::kFailingBack: return "failing-back";
    case SitePhase::kFailedBack: return "failed-back";
  }
  return "unknown";
}

Result<SiteState> LoadSiteState(Env* env, const std::string& path) {
  if (!env->Exists(path)) return SiteState{};
  CDP_ASSIGN_OR_RETURN(Bytes raw, ReadWholeFile(env, path));
  if (raw.size() > 4096) return Bad(path, "file too large");
  const std::string text(raw.begin(), raw.end());
  std::string_view rest(text);
  auto line = [&rest]() {
    size_t nl = rest.find('\n');
    std::string_view l = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    return l;
  };
  if (line() != kMagic) return Bad(path, "bad first line");
  SiteState s;
  std::string_view g = line();
  if (g.substr(0, 11) != "generation ") return Bad(path, "no generation line");
  g.remove_prefix(11);
  auto [p, ec] = std::from_chars(g.data(), g.data() + g.size(), s.generation);
  if (ec != std::errc() || p != g.data() + g.size() || s.generation == 0) return Bad(path, "bad generation");
  std::string_view ph = line();
  if (ph.substr(0, 6) != "phase ") return Bad(path, "no phase line");
  ph.remove_prefix(6);
  if (ph == "protecting") s.phase = SitePhase::kProtecting;
  else if (ph == "failing-back") s.phase = SitePhase::kFailingBack;
  else if (ph == "failed-back") s.phase = SitePhase::kFailedBack;
  else return Bad(path, "unknown phase");
  if (!rest.empty()) return Bad(path, "bytes after the phase line");
  return s;
}

Status SaveSiteState(Env* env, const std::string& path, const SiteState& s) {
  const std::string text = std::string(kMagic) + "\ngeneration " + std::to_string(s.generation) + "\nphase " +
                           std::string(SitePhaseName(s.phase)) + "\n";
  return WriteFileAtomic(env, path, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()), 0600);
}

}  // namespace cdp::agent
