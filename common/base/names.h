// SPDX-License-Identifier: Apache-2.0
// The name rule of tenants, volumes, clients, tags and certificate subjects:
// every one of them becomes a path part at some site (a tenant's directory, a
// volume's spool, an export's file), so the rule keeps them safe as such.
// The wire protocol, the PKI, control tokens and cdpctl all check it here.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

namespace cdp {

inline constexpr size_t kMaxNameLength = 128;

// 1..kMaxNameLength bytes of [A-Za-z0-9._-], not starting with '.' or '-'.
bool ValidName(std::string_view name);

}  // namespace cdp
