// SPDX-License-Identifier: Apache-2.0
#include "common/crypto/pki.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <functional>
#include <memory>
#include <vector>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "common/base/host_port.h"
#include "common/base/names.h"
#include "common/env/env.h"

namespace cdp::pki {

namespace {

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using CertPtr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using BioPtr = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using BnPtr = std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>>;

Status SslFailure(const std::string& what) { return Status::IOError(what + ": " + OpenSslErrors()); }

Result<KeyPtr> NewKey() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return SslFailure("generating a P-256 key");
  return key;
}

// Writes `data` to a new file at `path` with `mode` (O_EXCL), synced. A file
// this call created but could not finish is removed.
Status WriteNewFile(const std::string& path, const std::string& data, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) return Status::AlreadyExists(path + " exists; not overwriting it");
    return Status::FromErrno(errno, "create " + path);
  }
  auto fail = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::FromErrno(e, std::string(what) + " " + path);
  };
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write");
    }
    off += size_t(n);
  }
  if (::fsync(fd) != 0) return fail("fsync");
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(path.c_str());
    return Status::FromErrno(e, "close " + path);
  }
  return Status::OK();
}

// Writes a new private key and then its certificate. The key is created with
// O_EXCL (never overwriting one); a certificate at `cert_path` is replaced. If
// the certificate cannot be written, the key just made is removed again, so
// that a retry is not refused. The key's PEM text is wiped from memory.
Status WriteKeyAndCert(const std::string& key_path, std::string* key_pem, const std::string& cert_path,
                       const std::string& cert_pem) {
  Status s = WriteNewFile(key_path, *key_pem, 0600);
  OPENSSL_cleanse(key_pem->data(), key_pem->size());
  CDP_RETURN_IF_ERROR(s);
  if (::unlink(cert_path.c_str()) != 0 && errno != ENOENT) s = Status::FromErrno(errno, "unlink " + cert_path);
  if (s.ok()) s = WriteNewFile(cert_path, cert_pem, 0644);
  if (!s.ok()) ::unlink(key_path.c_str());
  return s;
}

// mkdir -p: the parents (0755) of `dir`, then `dir` itself with `mode`.
Status MakeDirs(const std::string& dir, mode_t mode) {
  for (size_t slash = dir.find('/', 1); slash != std::string::npos; slash = dir.find('/', slash + 1)) {
    const std::string parent = dir.substr(0, slash);
    if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir " + parent);
  }
  if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir " + dir);
  return Status::OK();
}

Result<std::string> Pem(const std::function<int(BIO*)>& write) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || write(bio.get()) != 1) return SslFailure("PEM encoding");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, size_t(n));
}

Status AddExt(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return SslFailure(std::string("extension ") + OBJ_nid2sn(nid));
  int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) return SslFailure("adding an extension");
  return Status::OK();
}

// A certificate for `key`, subject `id` (the CA's, CN=ca_name, when null),
// valid [now + nb, now + na], not yet signed.
Result<CertPtr> NewCert(EVP_PKEY* key, const Identity* id, const std::string& ca_name, int64_t nb, int64_t na) {
  CertPtr cert(X509_new());
  if (!cert) return SslFailure("X509_new");
  X509_set_version(cert.get(), 2);
  // A random positive 127-bit serial.
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return SslFailure("RAND_bytes");
  serial[0] &= 0x7f;
  BnPtr bn(BN_bin2bn(serial, sizeof(serial), nullptr));
  if (!bn || BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get())) == nullptr) return SslFailure("serial");
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), long(nb)) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), long(na)) == nullptr) {
    return SslFailure("validity");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  auto add = [&](const char* field, const std::string& value) {
    return X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(value.data()),
                                      int(value.size()), -1, 0) == 1;
  };
  bool ok = true;
  if (id == nullptr) {
    ok = add("CN", ca_name);
  } else {
    ok = add("CN", id->name) && (id->tenant.empty() || add("O", id->tenant)) && add("OU", std::string(RoleName(id->role)));
  }
  if (!ok) return SslFailure("subject");
  if (X509_set_pubkey(cert.get(), key) != 1) return SslFailure("public key");
  return cert;
}

Result<KeyPtr> ReadKey(const std::string& path) {
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) return Status::IOError("open " + path + ": " + OpenSslErrors());
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) return Status::InvalidArgument(path + ": not a PEM private key: " + OpenSslErrors());
  return key;
}

Result<CertPtr> ReadCert(const std::string& path) {
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) return Status::IOError("open " + path + ": " + OpenSslErrors());
  CertPtr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) return Status::InvalidArgument(path + ": not a PEM certificate: " + OpenSslErrors());
  return cert;
}

// Every entry of `nid` in `name`, as text. A name that is not valid UTF-8
// text is returned as "" (and so refused as a name).
std::vector<std::string> Entries(X509_NAME* name, int nid) {
  std::vector<std::string> out;
  for (int i = X509_NAME_get_index_by_NID(name, nid, -1); i >= 0; i = X509_NAME_get_index_by_NID(name, nid, i)) {
    ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
    unsigned char* utf8 = nullptr;
    int n = ASN1_STRING_to_UTF8(&utf8, data);
    out.push_back(n >= 0 ? std::string(reinterpret_cast<char*>(utf8), size_t(n)) : std::string());
    OPENSSL_free(utf8);
  }
  return out;
}

}  // namespace

std::string OpenSslErrors() {
  std::string out;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

std::string_view RoleName(CertRole r) {
  switch (r) {
    case CertRole::kAgent:
      return "agent";
    case CertRole::kProcessServer:
      return "ps";
    case CertRole::kMasterTarget:
      return "mt";
    case CertRole::kAdmin:
      return "admin";
    case CertRole::kTenant:
      return "tenant";
  }
  return "?";
}

bool HasTenant(CertRole r) { return r != CertRole::kMasterTarget && r != CertRole::kAdmin; }

Result<CertRole> ParseRole(std::string_view text) {
  if (text == "agent") return CertRole::kAgent;
  if (text == "ps") return CertRole::kProcessServer;
  if (text == "mt") return CertRole::kMasterTarget;
  if (text == "admin") return CertRole::kAdmin;
  if (text == "tenant") return CertRole::kTenant;
  return Status::InvalidArgument("unknown role '" + std::string(text) + "' (want agent, ps, mt, admin or tenant)");
}

Status InitCa(const std::string& dir, const CaOptions& options) {
  if (options.name.empty()) return Status::InvalidArgument("CA name is empty");
  if (options.valid_days < 1) return Status::InvalidArgument("CA validity must be at least 1 day");
  CDP_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  const std::string key_path = dir + "/ca.key";
  if (::access(key_path.c_str(), F_OK) == 0) return Status::AlreadyExists(key_path + " exists; not overwriting a CA");
  ERR_clear_error();
  CDP_ASSIGN_OR_RETURN(KeyPtr key, NewKey());
  CDP_ASSIGN_OR_RETURN(CertPtr cert, NewCert(key.get(), nullptr, options.name, -300, int64_t(options.valid_days) * 86400));
  X509_NAME* subject = X509_get_subject_name(cert.get());
  if (X509_set_issuer_name(cert.get(), subject) != 1) return SslFailure("issuer");
  CDP_RETURN_IF_ERROR(AddExt(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
  CDP_RETURN_IF_ERROR(AddExt(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign"));
  CDP_RETURN_IF_ERROR(AddExt(cert.get(), cert.get(), NID_subject_key_identifier, "hash"));
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return SslFailure("signing the CA certificate");
  CDP_ASSIGN_OR_RETURN(std::string key_pem, Pem([&](BIO* b) {
                         return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
                       }));
  CDP_ASSIGN_OR_RETURN(std::string cert_pem, Pem([&](BIO* b) { return PEM_write_bio_X509(b, cert.get()); }));
  // A stale ca.crt without its key is useless: it is replaced.
  CDP_RETURN_IF_ERROR(WriteKeyAndCert(key_path, &key_pem, dir + "/ca.crt", cert_pem));
  return EnsureCrl(dir);
}

namespace {

using CrlPtr = std::unique_ptr<X509_CRL, Deleter<X509_CRL, X509_CRL_free>>;
constexpr int64_t kCrlValidSeconds = 3650LL * 86400;

// The CA of `ca_dir`, its key checked against its certificate.
Status ReadCa(const std::string& ca_dir, KeyPtr* key, CertPtr* cert) {
  CDP_ASSIGN_OR_RETURN(*key, ReadKey(ca_dir + "/ca.key"));
  CDP_ASSIGN_OR_RETURN(*cert, ReadCert(ca_dir + "/ca.crt"));
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    ERR_clear_error();
    return Status::InvalidArgument(ca_dir + "/ca.key is not the key of " + ca_dir + "/ca.crt");
  }
  return Status::OK();
}

// Signs `crl` (now, valid kCrlValidSeconds) and writes it to ca_dir/crl.pem.
Status SignAndWriteCrl(const std::string& ca_dir, X509_CRL* crl, X509* ca_cert, EVP_PKEY* ca_key) {
  if (X509_CRL_set_version(crl, 1) != 1 || X509_CRL_set_issuer_name(crl, X509_get_subject_name(ca_cert)) != 1)
    return SslFailure("CRL issuer");
  std::unique_ptr<ASN1_TIME, Deleter<ASN1_TIME, ASN1_TIME_free>> last(X509_time_adj_ex(nullptr, 0, 0, nullptr));
  std::unique_ptr<ASN1_TIME, Deleter<ASN1_TIME, ASN1_TIME_free>> next(
      X509_time_adj_ex(nullptr, int(kCrlValidSeconds / 86400), 0, nullptr));
  if (!last || !next || X509_CRL_set1_lastUpdate(crl, last.get()) != 1 ||
      X509_CRL_set1_nextUpdate(crl, next.get()) != 1)
    return SslFailure("CRL times");
  if (X509_CRL_sort(crl) != 1 || X509_CRL_sign(crl, ca_key, EVP_sha256()) == 0) return SslFailure("signing the CRL");
  CDP_ASSIGN_OR_RETURN(std::string pem, Pem([&](BIO* b) { return PEM_write_bio_X509_CRL(b, crl); }));
  return WriteFileAtomic(DefaultEnv(), ca_dir + "/crl.pem",
                         ByteSpan(reinterpret_cast<const uint8_t*>(pem.data()), pem.size()), 0644);
}

Result<CrlPtr> ReadCrl(const std::string& path) {
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) return Status::NotFound(path + ": " + OpenSslErrors());
  CrlPtr crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr));
  if (!crl) return Status::InvalidArgument(path + ": not a PEM CRL: " + OpenSslErrors());
  return crl;
}

}  // namespace

std::string SerialHex(X509* cert) {
  BnPtr bn(ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), nullptr));
  if (!bn) return "";
  char* hex = BN_bn2hex(bn.get());
  std::string out = hex != nullptr ? hex : "";
  OPENSSL_free(hex);
  return out;
}

Status EnsureCrl(const std::string& ca_dir) {
  if (::access((ca_dir + "/crl.pem").c_str(), F_OK) == 0) return Status::OK();
  ERR_clear_error();
  KeyPtr ca_key;
  CertPtr ca_cert;
  CDP_RETURN_IF_ERROR(ReadCa(ca_dir, &ca_key, &ca_cert));
  CrlPtr crl(X509_CRL_new());
  if (!crl) return SslFailure("X509_CRL_new");
  return SignAndWriteCrl(ca_dir, crl.get(), ca_cert.get(), ca_key.get());
}

Status Revoke(const std::string& ca_dir, const std::string& cert_path) {
  ERR_clear_error();
  KeyPtr ca_key;
  CertPtr ca_cert;
  CDP_RETURN_IF_ERROR(ReadCa(ca_dir, &ca_key, &ca_cert));
  CDP_ASSIGN_OR_RETURN(CertPtr cert, ReadCert(cert_path));
  if (X509_verify(cert.get(), X509_get0_pubkey(ca_cert.get())) != 1) {
    ERR_clear_error();
    return Status::InvalidArgument(cert_path + " was not issued by the CA of " + ca_dir);
  }
  CDP_RETURN_IF_ERROR(EnsureCrl(ca_dir));
  CDP_ASSIGN_OR_RETURN(CrlPtr crl, ReadCrl(ca_dir + "/crl.pem"));
  X509_REVOKED* already = nullptr;
  if (X509_CRL_get0_by_serial(crl.get(), &already, X509_get0_serialNumber(cert.get())) == 1) return Status::OK();
  X509_REVOKED* r = X509_REVOKED_new();
  std::unique_ptr<ASN1_TIME, Deleter<ASN1_TIME, ASN1_TIME_free>> now(X509_time_adj_ex(nullptr, 0, 0, nullptr));
  if (r == nullptr || !now || X509_REVOKED_set_serialNumber(r, X509_get_serialNumber(cert.get())) != 1 ||
      X509_REVOKED_set_revocationDate(r, now.get()) != 1 || X509_CRL_add0_revoked(crl.get(), r) != 1) {
    if (r != nullptr) X509_REVOKED_free(r);
    return SslFailure("adding to the CRL");
  }
  return SignAndWriteCrl(ca_dir, crl.get(), ca_cert.get(), ca_key.get());
}


Status Issue(const std::string& ca_dir, const IssueOptions& options, const std::string& key_path,
             const std::string& cert_path) {
  const Identity& id = options.identity;
  if (!ValidName(id.name)) return Status::InvalidArgument("bad certificate name '" + id.name + "'");
  if (!HasTenant(id.role)) {
    if (!id.tenant.empty()) {
      return Status::InvalidArgument("a" + std::string(id.role == CertRole::kAdmin ? "n admin" : " master target") +
                                     " certificate has no tenant");
    }
  } else if (!ValidName(id.tenant)) {
    return Status::InvalidArgument("role " + std::string(RoleName(id.role)) + " needs a valid tenant, not '" +
                                   id.tenant + "'");
  }
  if (options.not_after_s <= options.not_before_s) return Status::InvalidArgument("certificate validity is empty");
  if (key_path == cert_path) return Status::InvalidArgument("key and certificate would both be " + key_path);
  for (const std::string& h : options.hosts) {
    if (!ValidHostName(h)) return Status::InvalidArgument("bad host name '" + h + "' for subjectAltName");
  }
  ERR_clear_error();
  CDP_ASSIGN_OR_RETURN(KeyPtr ca_key, ReadKey(ca_dir + "/ca.key"));
  CDP_ASSIGN_OR_RETURN(CertPtr ca_cert, ReadCert(ca_dir + "/ca.crt"));
  if (X509_check_private_key(ca_cert.get(), ca_key.get()) != 1) {
    ERR_clear_error();
    return Status::InvalidArgument(ca_dir + "/ca.key is not the key of " + ca_dir + "/ca.crt");
  }
  CDP_ASSIGN_OR_RETURN(KeyPtr key, NewKey());
  CDP_ASSIGN_OR_RETURN(CertPtr cert, NewCert(key.get(), &id, "", options.not_before_s, options.not_after_s));
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get())) != 1) return SslFailure("issuer");
  CDP_RETURN_IF_ERROR(AddExt(cert.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE"));
  CDP_RETURN_IF_ERROR(AddExt(cert.get(), ca_cert.get(), NID_key_usage, "critical,digitalSignature"));
  CDP_RETURN_IF_ERROR(AddExt(cert.get(), ca_cert.get(), NID_ext_key_usage, "serverAuth,clientAuth"));
  CDP_RETURN_IF_ERROR(AddExt(cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always"));
  std::vector<std::string> hosts = options.hosts;
  if (hosts.empty() && id.role == CertRole::kMasterTarget) {
    // NBD clients (GnuTLS) check the host they dial: the MT's exports listen
    // on loopback by default, and its name may be its DNS name.
    hosts = {"localhost", "127.0.0.1", "::1"};
    if (ValidHostName(id.name) && !IsIpAddress(id.name) && id.name != "localhost") hosts.push_back(id.name);
  }
  if (!hosts.empty()) {
    std::string san;
    for (const std::string& h : hosts) {
      if (!san.empty()) san += ",";
      san += (IsIpAddress(h) ? "IP:" : "DNS:") + h;
    }
    CDP_RETURN_IF_ERROR(AddExt(cert.get(), ca_cert.get(), NID_subject_alt_name, san.c_str()));
  }
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0) return SslFailure("signing the certificate");
  CDP_ASSIGN_OR_RETURN(std::string key_pem, Pem([&](BIO* b) {
                         return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
                       }));
  CDP_ASSIGN_OR_RETURN(std::string cert_pem, Pem([&](BIO* b) { return PEM_write_bio_X509(b, cert.get()); }));
  return WriteKeyAndCert(key_path, &key_pem, cert_path, cert_pem);
}

Result<Identity> IdentityOf(X509* cert) {
  if (cert == nullptr) return Status::PermissionDenied("no certificate");
  X509_NAME* subject = X509_get_subject_name(cert);
  const std::vector<std::string> roles = Entries(subject, NID_organizationalUnitName);
  const std::vector<std::string> tenants = Entries(subject, NID_organizationName);
  const std::vector<std::string> names = Entries(subject, NID_commonName);
  if (roles.empty()) return Status::PermissionDenied("certificate has no role (OU)");
  if (roles.size() > 1) return Status::PermissionDenied("certificate has more than one role (OU)");
  Result<CertRole> role = ParseRole(roles[0]);
  if (!role.ok()) {
    return Status::PermissionDenied("certificate role (OU) '" + roles[0] + "' is not agent, ps, mt, admin or tenant");
  }
  if (names.size() != 1 || !ValidName(names[0])) {
    return Status::PermissionDenied("certificate needs exactly one valid name (CN)");
  }
  Identity id;
  id.role = *role;
  id.name = names[0];
  if (!HasTenant(*role)) {
    if (!tenants.empty()) {
      return Status::PermissionDenied("a certificate of role " + std::string(RoleName(*role)) + " has a tenant (O)");
    }
  } else {
    if (tenants.size() != 1 || !ValidName(tenants[0])) {
      return Status::PermissionDenied("certificate needs exactly one valid tenant (O)");
    }
    id.tenant = tenants[0];
  }
  return id;
}

Result<Identity> IdentityOfFile(const std::string& cert_path, std::string* not_after) {
  ERR_clear_error();
  CDP_ASSIGN_OR_RETURN(CertPtr cert, ReadCert(cert_path));
  if (not_after != nullptr) {
    BioPtr bio(BIO_new(BIO_s_mem()));
    if (bio && ASN1_TIME_print(bio.get(), X509_get0_notAfter(cert.get())) == 1) {
      char* data = nullptr;
      long n = BIO_get_mem_data(bio.get(), &data);
      not_after->assign(data, size_t(n));
    }
  }
  return IdentityOf(cert.get());
}

}  // namespace cdp::pki
