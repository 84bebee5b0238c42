// SPDX-License-Identifier: Apache-2.0
// The site PKI of mutual TLS (common/net/tls_stream.h): one CA per site, one key
// and certificate per daemon, made with the OpenSSL library (`cdpctl pki`).
//
// Identity format (what TLS peers are checked against):
//   subject  CN=<name>, O=<tenant> (absent for role mt), OU=<role>
//   role     exactly one of "agent", "ps", "mt"
//   names    tenant and name pass ValidName (common/base/names.h)
// Keys are ECDSA P-256, signatures SHA-256. The CA certificate is
// CA:TRUE (critical) with keyCertSign; a daemon's certificate is CA:FALSE with
// digitalSignature and both serverAuth and clientAuth (every daemon is a TLS
// server to its clients and a client of its next hop).
//
// Files: private keys are created with mode 0600 (O_EXCL: an existing file is
// never overwritten), certificates 0644.
//
// Thread safety: every function is thread-safe (OpenSSL 3 is).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"

typedef struct x509_st X509;

namespace cdp::pki {

// kAgent, kProcessServer, kMasterTarget: the daemons (the data links and NBD).
// kAdmin, kTenant: people and their tools on the control API (cdpctl --tls-cert),
// mapped to an admin or a tenant caller as a token would be
// (common/http/http_server.h); the data links refuse them.
enum class CertRole { kAgent, kProcessServer, kMasterTarget, kAdmin, kTenant };
std::string_view RoleName(CertRole r);              // "agent" | "ps" | "mt" | "admin" | "tenant"
Result<CertRole> ParseRole(std::string_view text);  // kInvalidArgument naming the text
bool HasTenant(CertRole r);  // false for kMasterTarget and kAdmin (they see every tenant)

struct Identity {
  CertRole role = CertRole::kAgent;
  std::string tenant;  // empty for kMasterTarget and kAdmin, required for the others
  std::string name;    // CN
};

struct CaOptions {
  std::string name = "OpenCDP site CA";
  int valid_days = 3650;
};
// Creates `dir` if missing (0700; missing parents 0755), then dir/ca.key
// (0600) and dir/ca.crt (0644 less the umask), replacing a ca.crt without key.
// kAlreadyExists if dir/ca.key exists: a CA is never overwritten.
// kInvalidArgument for an empty name or valid_days < 1. On failure no key is
// left behind.
Status InitCa(const std::string& dir, const CaOptions& options);

struct IssueOptions {
  Identity identity;  // tenant required for agent, ps and tenant, refused for mt and admin
  // Validity relative to now, in seconds (tests make expired ones with < 0).
  int64_t not_before_s = -300;
  int64_t not_after_s = 825LL * 86400;
  // Host names and IP addresses the certificate is valid for as a server
  // (subjectAltName DNS:/IP:). Our own peers check the identity fields only;
  // GnuTLS clients such as libnbd (nbds://HOST) check HOST against these.
  // Empty for role mt: localhost, 127.0.0.1, ::1 and the name (when it is a
  // valid DNS name), so NBD clients reach the MT's exports as they are
  // configured by default. Empty for other roles: no subjectAltName.
  std::vector<std::string> hosts;
};
// Signs a new key and certificate with the CA of `ca_dir` (ca.key, ca.crt):
// `key_path` is created 0600 and never overwritten, `cert_path` (0644 less the
// umask) replaces any file there. kInvalidArgument for a bad identity, an empty
// validity, key_path == cert_path, or a ca.key that is not ca.crt's key;
// kAlreadyExists if `key_path` exists; otherwise an error naming the file. On
// failure no key is left behind.
Status Issue(const std::string& ca_dir, const IssueOptions& options, const std::string& key_path,
             const std::string& cert_path);

// Revocation (`cdpctl pki revoke`; daemons load the list as tls_crl,
// common/net/tls_stream.h). The CA's list is ca_dir/crl.pem: one X.509 v2
// CRL, signed with ca.key (SHA-256), valid for 10 years from its last change,
// written atomically with mode 0644 (it is public). Revoke adds the serial
// number of the certificate at `cert_path`, which this CA must have issued
// (kInvalidArgument otherwise); a certificate revoked already changes
// nothing. EnsureCrl writes an empty list when ca_dir/crl.pem is missing
// (InitCa does); both fail with the errors of Issue for a bad CA.
Status Revoke(const std::string& ca_dir, const std::string& cert_path);
Status EnsureCrl(const std::string& ca_dir);
// A certificate's serial number in upper-case hex (as CRLs and logs show it).
std::string SerialHex(X509* cert);

// OpenSSL's error queue, drained into one line ("unknown OpenSSL error" when
// empty). For the Status messages of this file and common/net/tls_stream.cc.
std::string OpenSslErrors();

// The identity in a certificate: exactly one CN and one OU with a known role,
// exactly one O for agent and ps and none for mt, every name valid. Anything
// else is kPermissionDenied naming what is wrong. Does not verify the
// signature (TLS has done that).
Result<Identity> IdentityOf(X509* cert);
// The same from a PEM file; also returns its notAfter as text in *not_after.
Result<Identity> IdentityOfFile(const std::string& cert_path, std::string* not_after = nullptr);

}  // namespace cdp::pki
