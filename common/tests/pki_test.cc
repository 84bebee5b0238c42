// SPDX-License-Identifier: Apache-2.0
// The site PKI (common/crypto/pki.h) seen through OpenSSL itself: file modes, the
// X.509 contents (extensions, key, signature, serial), chain verification with
// an X509_STORE, and IdentityOf on subjects built by hand. TLS over these
// certificates is tested in tls_test.cc.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/obj_mac.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include "common/crypto/pki.h"
#include "test_util.h"

namespace {

using cdp::pki::CertRole;
using cdp::pki::Identity;

template <typename T, void (*F)(T*)>
struct Free {
  void operator()(T* p) const { F(p); }
};
using CertPtr = std::unique_ptr<X509, Free<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Free<EVP_PKEY, EVP_PKEY_free>>;
using StorePtr = std::unique_ptr<X509_STORE, Free<X509_STORE, X509_STORE_free>>;
using StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, Free<X509_STORE_CTX, X509_STORE_CTX_free>>;

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

mode_t Mode(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CertPtr ReadCert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  REQUIRE(f != nullptr);
  CertPtr cert(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  REQUIRE(cert);
  return cert;
}

KeyPtr ReadKey(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  REQUIRE(f != nullptr);
  KeyPtr key(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  REQUIRE(key);
  return key;
}

// X509_verify_cert of `cert_path` against the single trusted `ca_path`, for
// `purpose` (0: none). Returns X509_V_OK or the verification error.
int Verify(const std::string& ca_path, const std::string& cert_path, int purpose = 0) {
  StorePtr store(X509_STORE_new());
  REQUIRE(store);
  CertPtr ca = ReadCert(ca_path);
  REQUIRE(X509_STORE_add_cert(store.get(), ca.get()) == 1);
  CertPtr cert = ReadCert(cert_path);
  StoreCtxPtr ctx(X509_STORE_CTX_new());
  REQUIRE(ctx);
  REQUIRE(X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) == 1);
  if (purpose != 0) REQUIRE(X509_STORE_CTX_set_purpose(ctx.get(), purpose) == 1);
  const int ok = X509_verify_cert(ctx.get());
  const int err = X509_STORE_CTX_get_error(ctx.get());
  return ok == 1 ? X509_V_OK : (err == X509_V_OK ? -1 : err);
}

struct Issued {
  std::string key;
  std::string cert;
};

cdp::Status IssueTo(const std::string& ca_dir, const Identity& id, const std::string& stem, Issued* out,
                    int64_t not_before_s = -300, int64_t not_after_s = 86400) {
  cdp::pki::IssueOptions io;
  io.identity = id;
  io.not_before_s = not_before_s;
  io.not_after_s = not_after_s;
  out->key = ca_dir + "/" + stem + ".key";
  out->cert = ca_dir + "/" + stem + ".crt";
  return cdp::pki::Issue(ca_dir, io, out->key, out->cert);
}

Issued MustIssue(const std::string& ca_dir, const Identity& id, const std::string& stem, int64_t not_before_s = -300,
                 int64_t not_after_s = 86400) {
  Issued out;
  cdp::Status s = IssueTo(ca_dir, id, stem, &out, not_before_s, not_after_s);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return out;
}

// The DER bytes of an octet string, for comparing key identifiers.
std::string Octets(const ASN1_OCTET_STRING* s) {
  REQUIRE(s != nullptr);
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)), size_t(ASN1_STRING_length(s)));
}

// True when extension `nid` of `cert` is present and marked critical.
bool Critical(X509* cert, int nid) {
  const int at = X509_get_ext_by_NID(cert, nid, -1);
  return at >= 0 && X509_EXTENSION_get_critical(X509_get_ext(cert, at)) == 1;
}

// An unsigned certificate whose subject has the entries `fields` (field, value),
// in that order; IdentityOf reads only the subject.
CertPtr WithSubject(const std::vector<std::pair<std::string, std::string>>& fields) {
  CertPtr cert(X509_new());
  REQUIRE(cert);
  X509_NAME* name = X509_get_subject_name(cert.get());
  for (const auto& [field, value] : fields) {
    REQUIRE(X509_NAME_add_entry_by_txt(name, field.c_str(), MBSTRING_UTF8,
                                       reinterpret_cast<const unsigned char*>(value.data()), int(value.size()), -1,
                                       0) == 1);
  }
  return cert;
}

}  // namespace

TEST_CASE("pki: role names round-trip and an unknown role is named in the refusal", "[pki]") {
  for (CertRole r :
       {CertRole::kAgent, CertRole::kProcessServer, CertRole::kMasterTarget, CertRole::kAdmin, CertRole::kTenant}) {
    auto back = cdp::pki::ParseRole(cdp::pki::RoleName(r));
    REQUIRE(back.ok());
    CHECK(*back == r);
  }
  CHECK(cdp::pki::RoleName(CertRole::kAgent) == "agent");
  CHECK(cdp::pki::RoleName(CertRole::kProcessServer) == "ps");
  CHECK(cdp::pki::RoleName(CertRole::kMasterTarget) == "mt");
  CHECK(cdp::pki::RoleName(CertRole::kAdmin) == "admin");
  CHECK(cdp::pki::RoleName(CertRole::kTenant) == "tenant");
  for (const char* bad : {"operator", "", "Agent", "ps ", "Admin"}) {
    auto r = cdp::pki::ParseRole(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == cdp::Code::kInvalidArgument);
    CHECK(r.status().message().find("'" + std::string(bad) + "'") != std::string::npos);
  }
}

TEST_CASE("pki: init writes a 0600 key and a CA certificate, and a second init touches neither", "[pki]") {
  cdp::testing::ScratchDir dir;
  const std::string ca = dir.Join("ca");
  cdp::pki::CaOptions co;
  co.name = "ACME DR CA";
  co.valid_days = 30;
  REQUIRE(cdp::pki::InitCa(ca, co).ok());
  CHECK(Mode(ca) == 0700);
  CHECK(Mode(ca + "/ca.key") == 0600);
  CHECK((Mode(ca + "/ca.crt") & ~mode_t(0644)) == 0);  // 0644 less the umask

  CertPtr cert = ReadCert(ca + "/ca.crt");
  CHECK(X509_get_version(cert.get()) == X509_VERSION_3);
  CHECK(X509_check_ca(cert.get()) == 1);
  CHECK(Critical(cert.get(), NID_basic_constraints));
  CHECK(Critical(cert.get(), NID_key_usage));
  CHECK((X509_get_key_usage(cert.get()) & (KU_KEY_CERT_SIGN | KU_CRL_SIGN)) == (KU_KEY_CERT_SIGN | KU_CRL_SIGN));
  CHECK(X509_get0_subject_key_id(cert.get()) != nullptr);
  CHECK(X509_get_signature_nid(cert.get()) == NID_ecdsa_with_SHA256);
  CHECK(X509_NAME_cmp(X509_get_subject_name(cert.get()), X509_get_issuer_name(cert.get())) == 0);
  char cn[64] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, cn, sizeof(cn));
  CHECK(std::string(cn) == "ACME DR CA");
  // Valid for about 30 days from now.
  CHECK(X509_cmp_time(X509_get0_notAfter(cert.get()), nullptr) > 0);
  time_t in_31_days = time(nullptr) + 31 * 86400;
  CHECK(X509_cmp_time(X509_get0_notAfter(cert.get()), &in_31_days) < 0);
  // The key is the certificate's and is P-256.
  KeyPtr key = ReadKey(ca + "/ca.key");
  CHECK(X509_check_private_key(cert.get(), key.get()) == 1);
  CHECK(EVP_PKEY_is_a(key.get(), "EC") == 1);
  char group[32] = {};
  size_t glen = 0;
  REQUIRE(EVP_PKEY_get_group_name(key.get(), group, sizeof(group), &glen) == 1);
  CHECK(std::string(group) == "prime256v1");
  // The self-signed CA verifies against itself.
  CHECK(Verify(ca + "/ca.crt", ca + "/ca.crt") == X509_V_OK);

  const std::string key_bytes = Slurp(ca + "/ca.key");
  const std::string cert_bytes = Slurp(ca + "/ca.crt");
  cdp::Status again = cdp::pki::InitCa(ca, {});
  CHECK(again.code() == cdp::Code::kAlreadyExists);
  CHECK(again.message().find(ca + "/ca.key") != std::string::npos);
  CHECK(Slurp(ca + "/ca.key") == key_bytes);
  CHECK(Slurp(ca + "/ca.crt") == cert_bytes);
  CHECK(Mode(ca + "/ca.key") == 0600);

  // Bad options are refused before anything is written.
  const std::string other = dir.Join("other");
  co.valid_days = 0;
  CHECK(cdp::pki::InitCa(other, co).code() == cdp::Code::kInvalidArgument);
  co = {};
  co.name.clear();
  CHECK(cdp::pki::InitCa(other, co).code() == cdp::Code::kInvalidArgument);
  CHECK_FALSE(Exists(other));
}

TEST_CASE("pki: issue for each role gives back exactly its identity, 0600 keys, verifying only against its CA",
          "[pki]") {
  cdp::testing::ScratchDir dir;
  const std::string a = dir.Join("a");
  const std::string b = dir.Join("b");
  REQUIRE(cdp::pki::InitCa(a, {}).ok());
  REQUIRE(cdp::pki::InitCa(b, {}).ok());

  const std::vector<Identity> ids = {
      {CertRole::kAgent, "acme", "db-host-1"},
      {CertRole::kProcessServer, "acme", "ps-1"},
      {CertRole::kMasterTarget, "", "mt-1"},
      {CertRole::kAdmin, "", "ops"},
      {CertRole::kTenant, "acme", "alice"},
  };
  CertPtr ca = ReadCert(a + "/ca.crt");
  for (const Identity& want : ids) {
    const std::string stem(cdp::pki::RoleName(want.role));
    DYNAMIC_SECTION(stem) {
      Issued f = MustIssue(a, want, stem);
      CHECK(Mode(f.key) == 0600);
      CHECK((Mode(f.cert) & ~mode_t(0644)) == 0);
      std::string not_after;
      auto got = cdp::pki::IdentityOfFile(f.cert, &not_after);
      INFO(got.status().ToString());
      REQUIRE(got.ok());
      CHECK(got->role == want.role);
      CHECK(got->tenant == want.tenant);
      CHECK(got->name == want.name);
      CHECK_FALSE(not_after.empty());

      CertPtr cert = ReadCert(f.cert);
      X509_NAME* subject = X509_get_subject_name(cert.get());
      CHECK(X509_NAME_entry_count(subject) == (want.tenant.empty() ? 2 : 3));
      CHECK(X509_NAME_get_index_by_NID(subject, NID_organizationName, -1) == (want.tenant.empty() ? -1 : 1));
      CHECK(X509_get_version(cert.get()) == X509_VERSION_3);
      CHECK(X509_check_ca(cert.get()) == 0);
      CHECK(Critical(cert.get(), NID_basic_constraints));
      CHECK((X509_get_key_usage(cert.get()) & KU_DIGITAL_SIGNATURE) != 0);
      CHECK((X509_get_key_usage(cert.get()) & KU_KEY_CERT_SIGN) == 0);
      CHECK((X509_get_extended_key_usage(cert.get()) & (XKU_SSL_SERVER | XKU_SSL_CLIENT)) ==
            (XKU_SSL_SERVER | XKU_SSL_CLIENT));
      CHECK(Octets(X509_get0_authority_key_id(cert.get())) == Octets(X509_get0_subject_key_id(ca.get())));
      CHECK(X509_get_signature_nid(cert.get()) == NID_ecdsa_with_SHA256);
      // A positive serial of at most 128 bits.
      const ASN1_INTEGER* serial = X509_get0_serialNumber(cert.get());
      std::unique_ptr<BIGNUM, Free<BIGNUM, BN_free>> bn(ASN1_INTEGER_to_BN(serial, nullptr));
      REQUIRE(bn);
      CHECK_FALSE(BN_is_negative(bn.get()));
      CHECK_FALSE(BN_is_zero(bn.get()));
      CHECK(BN_num_bits(bn.get()) <= 128);
      KeyPtr key = ReadKey(f.key);
      CHECK(X509_check_private_key(cert.get(), key.get()) == 1);
      CHECK(EVP_PKEY_is_a(key.get(), "EC") == 1);

      // Chain verification as TLS does it, for both directions of a connection.
      CHECK(Verify(a + "/ca.crt", f.cert) == X509_V_OK);
      CHECK(Verify(a + "/ca.crt", f.cert, X509_PURPOSE_SSL_CLIENT) == X509_V_OK);
      CHECK(Verify(a + "/ca.crt", f.cert, X509_PURPOSE_SSL_SERVER) == X509_V_OK);
      // Another CA does not vouch for it.
      CHECK(Verify(b + "/ca.crt", f.cert) == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY);
    }
  }
  // Two certificates never share a serial.
  Issued x = MustIssue(a, {CertRole::kAgent, "acme", "h-1"}, "x");
  Issued y = MustIssue(a, {CertRole::kAgent, "acme", "h-1"}, "y");
  CHECK(ASN1_INTEGER_cmp(X509_get0_serialNumber(ReadCert(x.cert).get()),
                         X509_get0_serialNumber(ReadCert(y.cert).get())) != 0);
}

TEST_CASE("pki: issue refuses bad identities and existing keys, writing nothing", "[pki]") {
  cdp::testing::ScratchDir dir;
  const std::string ca = dir.Join("ca");
  REQUIRE(cdp::pki::InitCa(ca, {}).ok());

  struct Bad {
    const char* what;
    Identity id;
  };
  const std::vector<Bad> bad = {
      {"mt with a tenant", {CertRole::kMasterTarget, "acme", "mt-2"}},
      {"agent without a tenant", {CertRole::kAgent, "", "host"}},
      {"ps without a tenant", {CertRole::kProcessServer, "", "ps-2"}},
      {"admin with a tenant", {CertRole::kAdmin, "acme", "ops"}},
      {"tenant without a tenant", {CertRole::kTenant, "", "alice"}},
      {"empty name", {CertRole::kAgent, "acme", ""}},
      {"path in name", {CertRole::kAgent, "acme", "../etc"}},
      {"name with a comma", {CertRole::kAgent, "acme", "a,OU=mt"}},
      {"bad tenant", {CertRole::kProcessServer, "ac/me", "ps-2"}},
  };
  for (const Bad& b : bad) {
    INFO(b.what);
    Issued f;
    cdp::Status s = IssueTo(ca, b.id, "bad", &f);
    CHECK(s.code() == cdp::Code::kInvalidArgument);
    CHECK_FALSE(Exists(f.key));
    CHECK_FALSE(Exists(f.cert));
  }

  // An empty or inverted validity.
  Issued f;
  CHECK(IssueTo(ca, {CertRole::kAgent, "acme", "h"}, "v", &f, 60, 60).code() == cdp::Code::kInvalidArgument);
  CHECK_FALSE(Exists(f.key));

  // An existing key is never overwritten, whatever the identity.
  Issued first = MustIssue(ca, {CertRole::kAgent, "acme", "db-host-1"}, "agent");
  const std::string key_bytes = Slurp(first.key);
  const std::string cert_bytes = Slurp(first.cert);
  Issued again;
  cdp::Status s = IssueTo(ca, {CertRole::kAgent, "acme", "db-host-2"}, "agent", &again);
  CHECK(s.code() == cdp::Code::kAlreadyExists);
  CHECK(s.message().find(first.key) != std::string::npos);
  CHECK(Slurp(first.key) == key_bytes);
  CHECK(Slurp(first.cert) == cert_bytes);

  // Key and certificate in one file would lose the key.
  cdp::pki::IssueOptions io;
  io.identity = {CertRole::kAgent, "acme", "h"};
  const std::string same = ca + "/same.pem";
  CHECK(cdp::pki::Issue(ca, io, same, same).code() == cdp::Code::kInvalidArgument);
  CHECK_FALSE(Exists(same));

  // No CA there.
  s = cdp::pki::Issue(dir.Join("nowhere"), io, dir.Join("n.key"), dir.Join("n.crt"));
  CHECK_FALSE(s.ok());
  CHECK(s.message().find(dir.Join("nowhere") + "/ca.key") != std::string::npos);
  CHECK_FALSE(Exists(dir.Join("n.key")));
}

TEST_CASE("pki: issue refuses a CA whose key is not its certificate's", "[pki]") {
  cdp::testing::ScratchDir dir;
  const std::string a = dir.Join("a");
  const std::string b = dir.Join("b");
  REQUIRE(cdp::pki::InitCa(a, {}).ok());
  REQUIRE(cdp::pki::InitCa(b, {}).ok());
  // a's certificate with b's key: what a botched copy of a CA directory looks like.
  REQUIRE(::unlink((a + "/ca.crt").c_str()) == 0);
  std::ofstream(a + "/ca.crt", std::ios::binary) << Slurp(b + "/ca.crt");
  REQUIRE(::unlink((b + "/ca.crt").c_str()) == 0);
  std::ofstream(b + "/ca.crt") << "not a certificate\n";
  Issued f;
  cdp::Status s = IssueTo(a, {CertRole::kAgent, "acme", "h"}, "h", &f);
  INFO(s.ToString());
  CHECK(s.code() == cdp::Code::kInvalidArgument);
  CHECK(s.message().find(a + "/ca.key") != std::string::npos);
  CHECK_FALSE(Exists(f.key));
  s = IssueTo(b, {CertRole::kAgent, "acme", "h"}, "h", &f);
  CHECK(s.code() == cdp::Code::kInvalidArgument);
  CHECK(s.message().find(b + "/ca.crt") != std::string::npos);
  CHECK_FALSE(Exists(f.key));
}

TEST_CASE("pki: an expired or not yet valid certificate fails X509_verify_cert with the matching error", "[pki]") {
  cdp::testing::ScratchDir dir;
  const std::string ca = dir.Join("ca");
  REQUIRE(cdp::pki::InitCa(ca, {}).ok());
  Issued old = MustIssue(ca, {CertRole::kAgent, "acme", "old"}, "old", -3600, -60);
  CHECK(Verify(ca + "/ca.crt", old.cert) == X509_V_ERR_CERT_HAS_EXPIRED);
  Issued early = MustIssue(ca, {CertRole::kAgent, "acme", "early"}, "early", 3600, 7200);
  CHECK(Verify(ca + "/ca.crt", early.cert) == X509_V_ERR_CERT_NOT_YET_VALID);
  // Its identity is still readable (for `cdpctl pki show` and logs).
  auto id = cdp::pki::IdentityOfFile(old.cert);
  REQUIRE(id.ok());
  CHECK(id->name == "old");
}

TEST_CASE("pki: IdentityOf refuses any subject that is not exactly one role, name and tenant", "[pki][security]") {
  SECTION("well-formed subjects are accepted") {
    auto agent = cdp::pki::IdentityOf(WithSubject({{"CN", "h-1"}, {"O", "acme"}, {"OU", "agent"}}).get());
    REQUIRE(agent.ok());
    CHECK(agent->role == CertRole::kAgent);
    CHECK(agent->tenant == "acme");
    CHECK(agent->name == "h-1");
    // The order of the entries does not matter.
    auto mt = cdp::pki::IdentityOf(WithSubject({{"OU", "mt"}, {"CN", "mt-1"}}).get());
    REQUIRE(mt.ok());
    CHECK(mt->role == CertRole::kMasterTarget);
    CHECK(mt->tenant.empty());
  }

  struct Case {
    const char* what;
    std::vector<std::pair<std::string, std::string>> subject;
    const char* says;  // part of the refusal
  };
  const std::vector<Case> cases = {
      {"no OU", {{"CN", "h-1"}, {"O", "acme"}}, "no role (OU)"},
      {"two OUs", {{"CN", "h-1"}, {"O", "acme"}, {"OU", "agent"}, {"OU", "agent"}}, "more than one role (OU)"},
      {"agent and mt", {{"CN", "h-1"}, {"OU", "mt"}, {"OU", "agent"}}, "more than one role (OU)"},
      {"unknown role", {{"CN", "h-1"}, {"O", "acme"}, {"OU", "operator"}}, "'operator'"},
      {"admin with an O", {{"CN", "ops"}, {"O", "acme"}, {"OU", "admin"}}, "tenant (O)"},
      {"tenant without O", {{"CN", "alice"}, {"OU", "tenant"}}, "tenant (O)"},
      {"role in capitals", {{"CN", "h-1"}, {"O", "acme"}, {"OU", "Agent"}}, "'Agent'"},
      {"blank role", {{"CN", "h-1"}, {"O", "acme"}, {"OU", " "}}, "role (OU)"},
      {"no CN", {{"O", "acme"}, {"OU", "agent"}}, "name (CN)"},
      {"two CNs", {{"CN", "h-1"}, {"CN", "h-2"}, {"O", "acme"}, {"OU", "agent"}}, "name (CN)"},
      {"invalid CN", {{"CN", "../h"}, {"O", "acme"}, {"OU", "agent"}}, "name (CN)"},
      {"agent without O", {{"CN", "h-1"}, {"OU", "agent"}}, "tenant (O)"},
      {"ps without O", {{"CN", "ps-1"}, {"OU", "ps"}}, "tenant (O)"},
      {"two Os", {{"CN", "h-1"}, {"O", "acme"}, {"O", "other"}, {"OU", "agent"}}, "tenant (O)"},
      {"invalid O", {{"CN", "h-1"}, {"O", "ac me"}, {"OU", "agent"}}, "tenant (O)"},
      {"mt with an O", {{"CN", "mt-1"}, {"O", "acme"}, {"OU", "mt"}}, "tenant (O)"},
      {"empty subject", {}, "no role (OU)"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto id = cdp::pki::IdentityOf(WithSubject(c.subject).get());
    REQUIRE_FALSE(id.ok());
    INFO(id.status().message());
    CHECK(id.status().code() == cdp::Code::kPermissionDenied);
    CHECK(id.status().message().find(c.says) != std::string::npos);
  }
  CHECK(cdp::pki::IdentityOf(nullptr).status().code() == cdp::Code::kPermissionDenied);
}

TEST_CASE("pki: IdentityOfFile names the file it cannot read", "[pki]") {
  cdp::testing::ScratchDir dir;
  auto missing = cdp::pki::IdentityOfFile(dir.Join("none.crt"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find(dir.Join("none.crt")) != std::string::npos);
  std::ofstream(dir.Join("junk.crt")) << "not a certificate\n";
  auto junk = cdp::pki::IdentityOfFile(dir.Join("junk.crt"));
  REQUIRE_FALSE(junk.ok());
  CHECK(junk.status().code() == cdp::Code::kInvalidArgument);
  CHECK(junk.status().message().find(dir.Join("junk.crt")) != std::string::npos);
  // The CA certificate is not a daemon's identity.
  REQUIRE(cdp::pki::InitCa(dir.Join("ca"), {}).ok());
  CHECK(cdp::pki::IdentityOfFile(dir.Join("ca") + "/ca.crt").status().code() == cdp::Code::kPermissionDenied);
}

TEST_CASE("pki: an mt certificate names loopback and its name as subjectAltName, others none, hosts override",
          "[pki][nbd]") {
  cdp::testing::ScratchDir dir;
  const std::string ca = dir.Join("ca");
  REQUIRE(cdp::pki::InitCa(ca, {}).ok());
  Issued mt = MustIssue(ca, {CertRole::kMasterTarget, "", "mt.provider.example"}, "mt");
  CertPtr cert = ReadCert(mt.cert);
  // What a GnuTLS or OpenSSL client checks when it dials the MT's NBD port.
  CHECK(X509_check_ip_asc(cert.get(), "127.0.0.1", 0) == 1);
  CHECK(X509_check_ip_asc(cert.get(), "::1", 0) == 1);
  CHECK(X509_check_host(cert.get(), "localhost", 0, 0, nullptr) == 1);
  CHECK(X509_check_host(cert.get(), "mt.provider.example", 0, 0, nullptr) == 1);
  CHECK(X509_check_host(cert.get(), "other.example", 0, 0, nullptr) == 0);
  CHECK(X509_check_ip_asc(cert.get(), "10.0.0.1", 0) == 0);

  Issued agent = MustIssue(ca, {CertRole::kAgent, "acme", "db-host-1"}, "agent");
  CertPtr ac = ReadCert(agent.cert);
  CHECK(X509_get_ext_by_NID(ac.get(), NID_subject_alt_name, -1) < 0);

  cdp::pki::IssueOptions io;
  io.identity = {CertRole::kMasterTarget, "", "mt-2"};
  io.hosts = {"10.0.0.7", "mt2.example"};
  REQUIRE(cdp::pki::Issue(ca, io, dir.Join("mt2.key"), dir.Join("mt2.crt")).ok());
  CertPtr m2 = ReadCert(dir.Join("mt2.crt"));
  CHECK(X509_check_ip_asc(m2.get(), "10.0.0.7", 0) == 1);
  CHECK(X509_check_host(m2.get(), "mt2.example", 0, 0, nullptr) == 1);
  CHECK(X509_check_ip_asc(m2.get(), "127.0.0.1", 0) == 0);
  io.hosts = {"bad host,DNS:evil"};
  CHECK(cdp::pki::Issue(ca, io, dir.Join("mt3.key"), dir.Join("mt3.crt")).code() == cdp::Code::kInvalidArgument);
}
