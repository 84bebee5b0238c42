// SPDX-License-Identifier: Apache-2.0
// What every daemon's main() shares: stop signals taken synchronously, and the
// tenant credential lines of the PS and MT configs.
//
// Thread safety: StopSignals is constructed and waited on by main() only.
#pragma once

#include <signal.h>

#include <boost/program_options.hpp>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "common/base/result.h"

namespace cdp {

// Construct first thing in main(), before any thread starts: blocks SIGINT,
// SIGTERM and SIGHUP in this thread (and so in every thread started later,
// which inherit the mask) and ignores SIGPIPE. Wait() returns the stop signal
// once one arrives; each SIGHUP before it runs `on_hup` (reload credentials).
class StopSignals {
 public:
  StopSignals();
  int Wait(const std::function<void()>& on_hup = {});

 private:
  sigset_t set_;
};

// Raises this process's soft limit on open descriptors (RLIMIT_NOFILE) to
// its hard limit. Descriptors grow with volumes where a volume's files stay
// open (the master target holds about 9 per volume: docs/benchmarks.md, "100
// volumes"), so a 1024 soft limit would stop a master target started by hand
// at about 120 volumes; the systemd units set LimitNOFILE=65536. Returns the
// soft limit in force afterwards (unchanged when it could not be raised, or
// when it is already the hard limit).
uint64_t RaiseOpenFileLimit();

// Keeps the data path's freed buffers for reuse. By default glibc serves a
// buffer over 128 KiB (a frame, a batch, a record of a resync run) with its
// own mmap and gives the memory back at free, or trims an arena's free top
// back to the kernel with madvise; the next buffer then faults its pages in
// and zeroes them again. Shipping 2 GiB through a process server spent more
// CPU on those faults than on TLS (docs/benchmarks.md, "Initial sync").
// Raises the mmap threshold to 32 MiB (the largest glibc takes) and the trim
// threshold to 64 MiB: buffers up to 32 MiB come from the arenas and stay
// there once freed. Peak memory is what it was (every buffer is capped by the
// protocol's and the daemon's own limits); the resident size no longer drops
// below that peak after it. Call first thing in main(). False when glibc
// refused a setting.
bool TuneMalloc();

// The caps on a daemon's peer connections (common/net/listener.h), from the config
// keys `max_connections` (all peers) and `max_connections_per_peer` (one IP
// address) of the data listener, and `control_max_connections_per_peer` (one
// IP address on the control port), all 1..65536; AddConnectionCapOptions
// declares them.
struct ConnectionCaps {
  size_t total = 256;
  size_t per_peer = 32;
  size_t control_per_peer = 32;
};
void AddConnectionCapOptions(boost::program_options::options_description* desc);
Result<ConnectionCaps> GetConnectionCaps(const boost::program_options::variables_map& vm);

// The TLS keys of every daemon's config (common/net/tls_stream.h):
//   tls = on | off     on by default; off is clear text (logged as a warning)
//   tls_ca = FILE      the site CA (`cdpctl pki init`)
//   tls_cert = FILE    this daemon's certificate (`cdpctl pki issue`)
//   tls_key = FILE     its private key
//   tls_crl = FILE     optional: the site CA's revocation list (`cdpctl pki
//                      revoke`), loaded at start and on SIGHUP; a revoked
//                      peer is refused and its live sessions end
// With tls on, a missing file key is kInvalidArgument naming the key.
struct TlsSettings {
  bool enabled = true;
  std::string ca;
  std::string cert;
  std::string key;
  std::string crl;

  static TlsSettings Off() {
    TlsSettings t;
    t.enabled = false;
    return t;
  }
};
void AddTlsOptions(boost::program_options::options_description* desc);
Result<TlsSettings> GetTlsSettings(const boost::program_options::variables_map& vm);

// One tenant's credential: "NAME:SECRET", "NAME = SECRET" or "NAME SECRET"
// (white space trimmed). kInvalidArgument naming the tenant for a bad name or
// an empty secret (the secret itself is never echoed).
Result<std::pair<std::string, std::string>> ParseTenantEntry(std::string_view line);

// The placeholder the shipped examples carry; never a real secret.
inline constexpr std::string_view kPlaceholderSecret = "change-me-to-a-long-random-secret";

// Refuses a tenant secret too weak to stand for a key, at start: the
// placeholder above, or under 128 bits (fewer than 16 bytes; written in hex
// digits only, fewer than 32 of them). kInvalidArgument naming `what` ("tenant
// 'acme'") and the reason, never the secret. `openssl rand -hex 32` makes a
// good one.
Status CheckSecretStrength(std::string_view secret, std::string_view what);

// Adds a ParseTenantEntry line to `tenants`; kInvalidArgument for a bad line or
// a tenant given twice.
Status AddTenantEntry(std::string_view line, std::map<std::string, std::string>* tenants);

}  // namespace cdp
