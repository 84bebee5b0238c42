// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the identity a TLS peer's certificate carries
// (common/crypto/pki.h IdentityOf): what the data path (common/net/tls_stream.cc), the
// NBD server's STARTTLS (common/nbd/nbd_server.cc) and the HTTP server read from a
// certificate the peer presented once its chain verified. The fuzzer plays a
// CA that signs anything: the subject is read without any signature check.
//
// Input: a DER certificate, through d2i_X509 and then IdentityOf.
//
// Properties: no crash, leak or sanitizer report; a refusal is
// kPermissionDenied; an identity has a role whose name parses back to it, a
// valid name, a tenant exactly when the role is not mt, and a valid tenant;
// the certificate encoded again (i2d_X509) and decoded gives the same
// identity, and so does a copy (X509_dup).
#include <openssl/err.h>
#include <openssl/x509.h>

#include <cstddef>
#include <cstdint>

#include "common/crypto/pki.h"
#include "common/wire/protocol.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;

bool Same(const pki::Identity& a, const pki::Identity& b) {
  return a.role == b.role && a.tenant == b.tenant && a.name == b.name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const unsigned char* p = data;
  X509* cert = d2i_X509(nullptr, &p, long(size));
  if (cert == nullptr) {
    ERR_clear_error();
    Check(pki::IdentityOf(nullptr).status().code() == Code::kPermissionDenied);
    return 0;
  }
  Result<pki::Identity> id = pki::IdentityOf(cert);
  if (!id.ok()) {
    Check(id.status().code() == Code::kPermissionDenied);
  } else {
    auto role = pki::ParseRole(pki::RoleName(id->role));
    Check(role.ok() && *role == id->role);
    Check(ValidName(id->name));
    if (id->role == pki::CertRole::kMasterTarget) {
      Check(id->tenant.empty());
    } else {
      Check(ValidName(id->tenant));
    }
  }

  unsigned char* der = nullptr;
  const int n = i2d_X509(cert, &der);
  if (n > 0) {
    const unsigned char* q = der;
    X509* again = d2i_X509(nullptr, &q, n);
    // What OpenSSL encoded it decodes (it keeps the received encoding).
    Check(again != nullptr);
    Result<pki::Identity> id2 = pki::IdentityOf(again);
    Check(id2.ok() == id.ok() && (!id.ok() || Same(*id, *id2)));
    X509_free(again);
  }
  OPENSSL_free(der);
  if (X509* copy = X509_dup(cert)) {
    Result<pki::Identity> id3 = pki::IdentityOf(copy);
    Check(id3.ok() == id.ok() && (!id.ok() || Same(*id, *id3)));
    X509_free(copy);
  }
  X509_free(cert);
  ERR_clear_error();
  return 0;
}
