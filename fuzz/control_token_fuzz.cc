// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the control API's token files and bearer tokens
// (common/http/control_token.h): the admin token file (ReadTokenFile), the master
// target's tenant token file ("TENANT SHA256HEX" lines, read by
// ControlTokens::Open) and a presented token (ControlTokens::Authenticate, what
// every "Authorization: Bearer" header reaches).
//
// Input: up to three parts joined by fuzz::kFileSeparator: the admin token
// file, the tenant token file (absent when there is no second part), the
// presented token. The files live in a MemEnv (no mode check there).
//
// Properties: no crash, leak or sanitizer report; a token read from a file is
// its first line trimmed, non-empty, of [0-9A-Za-z_-] only; after a successful
// Open the admin token authenticates as the admin, the tenant token counts
// add up to the file's token lines, and a presented token that authenticates
// as a tenant names a tenant of the file. Round trip: a token issued and the
// file written back (SaveTenants) open again to the same tenants plus the new
// token, which authenticates as its tenant, and every presented token answers
// as before; revoking a tenant removes exactly its tokens, in a reopen too.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/env/env.h"
#include "common/http/control_token.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;

constexpr char kAdmin[] = "/state/control.token";
constexpr char kTenants[] = "/state/tenant_tokens";

std::string_view AsText(ByteSpan b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool TokenChars(std::string_view t) {
  for (char c : t) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

// Lines of the tenant file that hold a token (not blank, not a comment).
size_t TokenLines(std::string_view text) {
  size_t n = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.empty() && line.front() != '#') ++n;
  }
  return n;
}

bool SameCaller(const Result<http::Caller>& a, const Result<http::Caller>& b) {
  if (a.ok() != b.ok()) return false;
  return !a.ok() || (a->admin == b->admin && a->tenant == b->tenant && a->read_only == b->read_only &&
                     a->token_id == b->token_id);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<ByteSpan> parts = fuzz::SplitFiles(ByteSpan(data, size), 3);
  std::unique_ptr<Env> env = NewMemEnv();
  Check(env->CreateDirs("/state").ok());
  Check(WriteFileAtomic(env.get(), kAdmin, parts[0], 0600).ok());
  const bool have_tenants = parts.size() > 1;
  if (have_tenants) Check(WriteFileAtomic(env.get(), kTenants, parts[1], 0600).ok());
  const std::string presented(parts.size() > 2 ? AsText(parts[2]) : std::string_view());

  // The admin token file alone.
  Result<std::string> admin = ReadTokenFile(env.get(), kAdmin);
  if (admin.ok()) {
    std::string_view text = AsText(parts[0]);
    Check(!admin->empty() && TokenChars(*admin) && *admin == Trim(text.substr(0, text.find('\n'))));
  } else {
    Check(admin.status().code() == Code::kInvalidArgument);
  }

  auto tokens = ControlTokens::Open(env.get(), kAdmin, have_tenants ? kTenants : "");
  if (!tokens.ok()) {
    // The admin file's error, or the tenant file's corruption.
    Check(!admin.ok() || (have_tenants && tokens.status().IsCorruption()));
    return 0;
  }
  Check(admin.ok());
  ControlTokens& t = **tokens;
  auto as_admin = t.Authenticate(*admin);
  Check(as_admin.ok() && as_admin->admin && as_admin->tenant.empty());
  const std::map<std::string, size_t> counts = t.TenantTokenCounts();
  Check(t.List().size() == (have_tenants ? TokenLines(AsText(parts[1])) : 0));
  const Result<http::Caller> caller = t.Authenticate(presented);
  if (caller.ok() && !caller->admin) Check(counts.count(caller->tenant) == 1);
  if (!have_tenants) return 0;

  // Issue a token: the file is written back and must open to the same
  // tenants plus the new token.
  Result<std::string> issued = t.IssueTenantToken("fuzz-tenant");
  Check(issued.ok() && issued->size() == 64 && TokenChars(*issued));
  auto reopened = ControlTokens::Open(env.get(), kAdmin, kTenants);
  Check(reopened.ok());
  std::map<std::string, size_t> want = counts;
  ++want["fuzz-tenant"];
  Check((*reopened)->TenantTokenCounts() == want);
  auto as_new = (*reopened)->Authenticate(*issued);
  Check(as_new.ok() && !as_new->admin);
  // An older line may carry the new token's digest only by a SHA-256 collision:
  // the first tenant in the file whose digest matches answers.
  Check(as_new->tenant == "fuzz-tenant" || counts.count(as_new->tenant) == 1);
  Check(SameCaller((*reopened)->Authenticate(presented), caller));
  Check(SameCaller((*reopened)->Authenticate(*admin), as_admin));

  // Revoke the first tenant of the file: exactly its tokens go, in a reopen too.
  if (!counts.empty()) {
    const std::string victim = counts.begin()->first;
    Result<size_t> removed = (*reopened)->RevokeTenantTokens(victim);
    Check(removed.ok() && *removed == want[victim]);
    want.erase(victim);
    Check((*reopened)->TenantTokenCounts() == want);
    auto again = ControlTokens::Open(env.get(), kAdmin, kTenants);
    Check(again.ok() && (*again)->TenantTokenCounts() == want);
    auto after = (*again)->Authenticate(presented);
    if (caller.ok() && !caller->admin && caller->tenant != victim) Check(SameCaller(after, caller));
    if (after.ok() && !after->admin) Check(after->tenant != victim);
    Check((*again)->RevokeTenantTokens(victim).status().IsNotFound());
  }
  return 0;
}
