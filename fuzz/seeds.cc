// SPDX-License-Identifier: Apache-2.0
// Writes the seed corpora of the fuzz targets (fuzz/targets.cmake) except
// protocol (fuzz/make_seeds.cc): `fuzz_seeds DIR` fills DIR/<target>/ with a
// few well-formed inputs of each, so that short runs start past the magics and
// CRCs. Multi-file inputs are joined with fuzz::JoinFiles.
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "common/crypto/pki.h"
#include "common/crypto/seal.h"
#include "common/nbd/nbd_proto.h"
#include "common/store/segment_log.h"
#include "common/wire/protocol.h"
#include "fuzz/fuzz_util.h"
#include "master-target/journal.h"
#include "process-server/spool.h"
#include "process-server/spool_meta.h"

using namespace cdp;

namespace {

bool g_ok = true;

void Write(const std::string& dir, const std::string& name, const Bytes& b) {
  ::mkdir(dir.c_str(), 0755);
  std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(b.data(), 1, b.size(), f) == b.size();
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::fprintf(stderr, "fuzz_seeds: cannot write %s\n", path.c_str());
    g_ok = false;
  }
}

Bytes B(std::string_view s) { return Bytes(s.begin(), s.end()); }
Bytes Cat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Bytes Option(uint32_t opt, const Bytes& data) {
  Bytes b;
  nbd::PutBE64(b, nbd::kIHaveOpt);
  nbd::PutBE32(b, opt);
  nbd::PutBE32(b, uint32_t(data.size()));
  return Cat(b, data);
}

Bytes InfoData(std::string_view name, std::vector<uint16_t> infos) {
  Bytes b;
  nbd::PutBE32(b, uint32_t(name.size()));
  PutBytes(b, name);
  nbd::PutBE16(b, uint16_t(infos.size()));
  for (uint16_t i : infos) nbd::PutBE16(b, i);
  return b;
}

void NbdOption(const std::string& dir) {
  Bytes flags;
  nbd::PutBE32(flags, nbd::kClientFlagFixedNewstyle | nbd::kClientFlagNoZeroes);
  Write(dir, "go", Cat(flags, Option(nbd::kOptGo, InfoData("db1", {nbd::kInfoBlockSize, nbd::kInfoName}))));
  Write(dir, "info-list-go",
        Cat(Cat(Cat(flags, Option(nbd::kOptInfo, InfoData("", {}))), Option(nbd::kOptList, {})),
            Option(nbd::kOptGo, InfoData("acme/db1@2026-11-01T00:00:00Z", {nbd::kInfoExport}))));
  Write(dir, "export-name", Cat(Cat(flags, Option(nbd::kOptStructuredReply, {})), Option(nbd::kOptExportName, B("db1"))));
  Write(dir, "abort", Cat(flags, Option(nbd::kOptAbort, {})));
}

void NbdRequest(const std::string& dir) {
  auto req = [](uint16_t type, uint16_t flags, uint64_t off, uint32_t len) {
    nbd::Request r;
    r.type = type;
    r.flags = flags;
    r.handle = 0x1234;
    r.offset = off;
    r.length = len;
    return nbd::EncodeRequest(r);
  };
  Write(dir, "read", req(nbd::kCmdRead, 0, 0, 4096));
  Write(dir, "write-flush-disc",
        Cat(Cat(Cat(req(nbd::kCmdWrite, nbd::kCmdFlagFua, 512, 16), Bytes(16, 0xab)), req(nbd::kCmdFlush, 0, 0, 0)),
            req(nbd::kCmdDisc, 0, 0, 0)));
  Write(dir, "trim-zero", Cat(req(nbd::kCmdTrim, 0, 4096, 8192), req(nbd::kCmdWriteZeroes, nbd::kCmdFlagNoHole, 0, 1 << 20)));
  Write(dir, "past-end", req(nbd::kCmdRead, 0, ~0ull - 10, 4096));
}

void Http(const std::string& dir) {
  Write(dir, "metrics", B("GET /metrics?format=json HTTP/1.1\r\nHost: 127.0.0.1:9100\r\nAuthorization: Bearer admin-token\r\n\r\n"));
  Write(dir, "status-keepalive",
        B("GET /status HTTP/1.1\r\nHost: localhost\r\nauthorization: bearer acme-token\r\n\r\nGET /metrics HTTP/1.1\r\nHost: [::1]:9100\r\nAuthorization: Bearer admin-token\r\n\r\n"));
  Write(dir, "post-json",
        B("POST /v1/volumes/db%31/tag?name=a+b&x=%2F HTTP/1.1\r\nHost: cdp.example\r\n"
          "Authorization: Bearer admin-token\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: 13\r\n\r\n{\"tag\":\"t1\"}\n"));
  Write(dir, "chunked",
        B("DELETE /v1/volumes/db1 HTTP/1.1\r\nHost: 10.0.0.1\r\nauthorization: bearer acme-token\r\nContent-Type: application/json\r\n"
          "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"));
  Write(dir, "form-post", B("POST /v1/volumes/x HTTP/1.0\r\nHost: evil.example\r\n"
                            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 3\r\n\r\na=b"));
  Write(dir, "expect", B("PUT /v1/throw HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer admin-token\r\nExpect: 100-continue\r\n"
                         "Content-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"));
  Write(dir, "points", B("GET /v1/volumes/db1/points/2026?from=1&from=2 HTTP/1.1\r\nHost: LOCALHOST\r\nAuthorization: Bearer admin-token\r\n\r\n"));
  // Regression: a chunked body cut after its final "0\r\n" once made the
  // harness offer Beast the same bytes twice (an assertion in parse_chunk_header).
  Write(dir, "chunked-final-cut", B("PUT /w HTTP/1.1\r\nHost: localhost\r\n" + std::string("Authorization: Bearer admin-token\r\n") +
                                    "Transfer-Encoding: chunked\r\n\r\n0\r\n"));
  Write(dir, "params", B("POST /v1/params HTTP/1.1\r\nHost: 127.0.0.1\r\nauthorization: bearer acme-token\r\nContent-Type: application/json\r\n"
                         "Content-Length: 51\r\n\r\n{\"volume\":\"db1\",\"seq\":7,\"writable\":true,\"mbps\":2.5}"));
  Write(dir, "params-get", B("GET /v1/params?volume=db1&seq=18446744073709551615&writable=0&mbps=1e3 HTTP/1.1\r\n"
                             "Host: 127.0.0.1\r\nAuthorization: Bearer admin-token\r\n\r\n"));
}

void Config(const std::string& dir) {
  Write(dir, "ps.conf",
        B("# comment\nlisten = 0.0.0.0:7400\ncontrol = 127.0.0.1:9101\nmt = mt.example:7500\n"
          "tenant = acme:secret-secret-secret\ntenant = beta:another-secret-1234\nquota = 50GiB\n"
          "segment_size = 64MiB\ncodec = zstd\nlevel = 3\nvolume_codec = acme/logs=lz4\n"
          "frame_size = 1.5MiB\nthrottle_mbps = 100.5\nthrottle_schedule = 20@08:00-18:00,50@18:00-08:00\n"
          "throttle_burst = 256KiB\nmax_connections = 256\n[log]\nlevel = \"debug\"\nfile = /tmp/x.log\n"));
  Write(dir, "flags", Cat(B("quota = 1G\n"), Cat(B(fuzz::kFileSeparator),
                                                 B("--quota=10MB\n--codec\nlz4\n--level=2\n--help"))));
  Write(dir, "size", B("1.25TiB"));
  Write(dir, "duration", B("1h30m15.5s"));
  Write(dir, "bad", B("[log\nkey value\nlisten = 1.2.3.4:99999\nlisten = x\n"));
}

Bytes SegmentHeader(uint16_t kind, uint64_t number, uint64_t first_seq) {
  return seglog::EncodeHeader(seglog::Header{kind, number, first_seq});
}

void SegmentLog(const std::string& dir) {
  Bytes seg = SegmentHeader(7, 1, 1);
  Bytes head(32, 0x01);
  for (int i = 0; i < 3; ++i) seglog::AppendRecord(head, B("payload-" + std::to_string(i)), &seg);
  for (uint8_t sel : {0x0f, 0x01, 0x2b, 0x00}) Write(dir, "seg-" + std::to_string(sel), Cat(Bytes{sel}, seg));
  Bytes torn = Cat(Bytes{0x0b}, seg);
  torn.resize(torn.size() - 5);
  Write(dir, "torn", torn);
}

void Spool(const std::string& dir) {
  auto segment = [](uint64_t first, uint64_t count, bool torn) {
    Bytes b = SegmentHeader(ps::kSpoolKind, first, first);
    for (uint64_t s = first; s < first + count; ++s) {
      proto::Record r;
      r.seq = s;
      r.offset = s * 4096;
      r.timestamp_us = 1700000000000000ull + s;
      if (s % 7 == 0) {
        // A sealed volume's records (common/crypto/seal.h): blocks then MACs, or MACs alone.
        r.kind = s % 2 == 0 ? proto::RecordKind::kSealed : proto::RecordKind::kSealedZero;
        r.offset = s * 4096;
        r.length = 4096;
        r.data = Bytes(r.kind == proto::RecordKind::kSealed ? 4096 + 16 : 16, uint8_t(s));
      } else if (s % 3 == 0) {
        r.kind = proto::RecordKind::kZero;
        r.length = 4096;
      } else if (s % 5 == 0) {
        r.kind = proto::RecordKind::kTag;
        r.data = B("tag-" + std::to_string(s));
      } else if (s % 11 == 0) {
        // The agent's ransomware detector fired (offset and length 0).
        r.kind = proto::RecordKind::kAnomaly;
        r.offset = 0;
        r.data = proto::EncodeAnomaly(3, "change rate 9.0 MB/s (baseline 1.0 MB/s), 98% incompressible");
      } else {
        r.kind = proto::RecordKind::kData;
        r.length = 16;
        r.data = Bytes(16, uint8_t(s));
      }
      ps::EncodeSpoolRecord(r, &b);
    }
    if (torn) b.resize(b.size() - 7);
    return b;
  };
  Write(dir, "one", segment(1, 4, false));
  Write(dir, "two", fuzz::JoinFiles({segment(1, 3, false), segment(4, 6, true)}));
  Write(dir, "floor-jump", fuzz::JoinFiles({segment(1, 2, false), segment(10, 2, false), segment(12, 0, false)}));
}

// A selector byte (spool_meta_fuzz.cc: the file, and whether the harness adds
// the CRC), then the file.
void SpoolMeta(const std::string& dir) {
  proto::VolumeOpen open;
  open.name = "db";
  open.size = 1 << 30;
  open.uuid[0] = 7;
  open.generation = 2;
  Write(dir, "volume", Cat(Bytes{0x00}, ps::EncodeVolumeMeta(open)));
  open.sealed = true;
  Bytes sealed = ps::EncodeVolumeMeta(open);
  sealed.resize(sealed.size() - 4);  // the harness adds the CRC
  Write(dir, "volume-sealed-crc", Cat(Bytes{0x04}, sealed));
  Write(dir, "copies", Cat(Bytes{0x01}, ps::EncodeCopiesMeta({{"mt-a:10809", 17}, {"mt-b:10809", 5}})));
  Write(dir, "beyond", Cat(Bytes{0x02}, ps::EncodeCopyList(ps::kBeyondList, {"mt-b:10809"})));
  Write(dir, "anchor-one-copy", Cat(Bytes{0x03}, ps::EncodeCopyList(ps::kAnchorList, {""})));
}

void Journal(const std::string& dir) {
  auto segment = [](uint64_t number, uint64_t first_seq, int count) {
    Bytes b = mt::EncodeSegmentHeader(mt::SegmentHeader{number, first_seq});
    for (int i = 0; i < count; ++i) {
      if (i % 3 == 2) {
        // Kind 3: old data that compresses, as a zstd frame.
        Bytes old(4096);
        for (size_t k = 0; k < old.size(); ++k) old[k] = uint8_t("old text block "[k % 15]);
        mt::EncodeOldData(first_seq + i, 4096 * i, 17, old, 1, &b);
      } else if (i % 2 == 0) {
        mt::EncodeUndoRecord(mt::UndoKind::kData, first_seq + i, 4096 * i, 24, 17, Bytes(24, uint8_t(i + 1)), &b);
      } else {
        mt::EncodeUndoRecord(mt::UndoKind::kZeroes, first_seq + i, 4096 * i, 4096, 17, {}, &b);
      }
    }
    return b;
  };
  Write(dir, "one", Cat(Bytes{0x03}, segment(1, 1, 3)));
  Write(dir, "two", Cat(Bytes{0x10}, fuzz::JoinFiles({segment(1, 1, 2), segment(2, 3, 4)})));
  Bytes torn = Cat(Bytes{0x01}, segment(5, 9, 2));
  torn.resize(torn.size() - 3);
  Write(dir, "torn", torn);
  // A zstd record whose CRC holds but whose bytes are no zstd frame: read as
  // corruption (found by a long run of the journal target, session 20).
  Bytes garbage = mt::EncodeSegmentHeader(mt::SegmentHeader{2, 1});
  mt::EncodeUndoRecord(mt::UndoKind::kZstd, 1, 0, 4096, 17, Bytes(33, 0x5a), &garbage);
  Write(dir, "zstd-not-a-frame", Cat(Bytes{0x02}, garbage));
}


// ---- control_token: admin token file | tenant token file | presented token.

std::string Sha256Hex(std::string_view token) {
  uint8_t d[32];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d);
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

void ControlToken(const std::string& dir) {
  const std::string admin = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n";
  const std::string tenants = "# tenant control tokens (SHA-256 of each token): cdpctl token issue|revoke\n"
                              "acme " + Sha256Hex("acme-token") + "\n"
                              "beta " + Sha256Hex("beta-token-1") + "\n"
                              "acme " + Sha256Hex("acme-token-2") + "\n";
  Write(dir, "admin-only", B(admin));
  Write(dir, "tenants", fuzz::JoinFiles({B(admin), B(tenants), B("acme-token")}));
  Write(dir, "admin-bearer", fuzz::JoinFiles({B("  admin_Token-1 \r\nsecond line\n"), B("\n  # nothing\n\n"), B("admin_Token-1")}));
  Write(dir, "same-digest-two-tenants",
        fuzz::JoinFiles({B(admin), B("zeta " + Sha256Hex("shared") + "\r\nalpha \t" + Sha256Hex("shared") + "\n"), B("shared")}));
  Write(dir, "bad-line", fuzz::JoinFiles({B(admin), B("acme " + Sha256Hex("x").substr(0, 63) + "G\n"), B("x")}));
  Write(dir, "bad-admin", fuzz::JoinFiles({B("not a token!\n"), B(""), B("")}));
}

// ---- mt_tenants: a selector byte (bit 0: the whole loader), then parts.

void MtTenants(const std::string& dir) {
  const std::string file = "# provider tenants\n\nbeta = s3cret-beta\n  gamma:s3cret-gamma  \ndelta\tsecret=with=equals\r\n";
  Write(dir, "fast-file-and-keys",
        Cat(Bytes{0x00}, fuzz::JoinFiles({B(file), B("tacme:s3cret-acme\nqbeta:1GiB\ncgamma:3\nlacme=30d\n"
                                                      "racme/db1=7d\nvbeta/logs=12h30m\ndacme\n")})));
  Write(dir, "fast-keys-only", Cat(Bytes{0x02}, fuzz::JoinFiles({B(""), B("tacme = s3cret\ntbeta s3cret-b\nqacme:10G\n"
                                                                           "cacme:19\nlbeta=1h\nvacme/db1=0s\n")})));
  Write(dir, "fast-bad", Cat(Bytes{0x04}, fuzz::JoinFiles({B("acme:\nbad name:x\nacme:x\nacme:y\n"), B("qnobody:1G\n")})));
  Write(dir, "loader",
        Cat(Bytes{0x01}, fuzz::JoinFiles({B("tls = off\nnbd_tls = off\ntenant = acme:s3cret-acme\ntenants_file = /etc/opencdp/tenants\n"
                                            "tenant_quota = beta:1GiB\ntenant_journal_compression = acme:5\n"
                                            "tenant_retention_lock = beta=2d\nvolume_retention = acme/db1=7d\n"
                                            "volume_retention_lock = acme/db1=1h\ndirect_agents = beta\n"
                                            "[retention]\nlock = 12h\nmax_age = 30d\n"),
                                          B("--tenant=gamma:s3cret-gamma\n--storage=ceph"), B(file)})));
  Write(dir, "loader-help", Cat(Bytes{0x03}, fuzz::JoinFiles({B("tls = off\n"), B("--help")})));
  // Regression: a CR between the name and the separator once left the
  // separator in the secret ("acme \r= s" gave "= s", "acme = s" gives "s"),
  // so the line did not read as its NAME:SECRET form (found by this target,
  // session 22).
  Write(dir, "tenant-cr-before-separator", Cat(Bytes{0x00}, B("acme \r= s3cret-acme\n")));
  // Regression: an ambiguous flag whose token held a Boost placeholder made
  // what() loop forever, growing (found by this target, session 22; fixed in
  // common/daemon/config.cc, CommandLineError).
  Write(dir, "flag-with-placeholder",
        Cat(Bytes{0x01}, fuzz::JoinFiles({B("tls = off\n"), B("--t=s3cret-be%original_token%e")})));
}

// ---- key_file: the tenant key file's text (also offered as volume keys).

void KeyFile(const std::string& dir) {
  seal::TenantKey key;
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = uint8_t(i * 7 + 1);
  const std::string text = seal::EncodeTenantKey(key);
  Write(dir, "key", B(text));
  std::string upper = text;
  for (size_t i = upper.find('\n') + 1; i < upper.size(); ++i) upper[i] = char(std::toupper(upper[i]));
  Write(dir, "key-upper-no-newline", B(upper.substr(0, upper.size() - 1)));
  Write(dir, "key-crlf", B(text.substr(0, text.size() - 1) + "\r\n"));
  auto vk = seal::DeriveVolumeKeys(key, "db1");
  if (vk.ok()) {
    Bytes raw(vk->data.begin(), vk->data.end());
    raw.insert(raw.end(), vk->integrity.begin(), vk->integrity.end());
    Write(dir, "volume-keys", raw);
  }
  Bytes same(64, 0x11);  // XTS refuses equal halves
  same.insert(same.end(), 32, 0x22);
  Write(dir, "volume-keys-equal-halves", same);
}

// ---- x509_identity: DER certificates.

Bytes Der(X509* cert) {
  unsigned char* p = nullptr;
  int n = i2d_X509(cert, &p);
  Bytes b;
  if (n > 0) b.assign(p, p + n);
  OPENSSL_free(p);
  return b;
}

// A self-signed certificate with the subject entries given (NID, ASN.1 string
// type, value), for subjects `cdpctl pki` would never make.
Bytes SubjectCert(const std::vector<std::tuple<int, int, std::string>>& entries) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  Bytes out;
  if (key != nullptr && cert != nullptr) {
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 7);
    X509_gmtime_adj(X509_getm_notBefore(cert), 0);
    X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
    X509_NAME* name = X509_get_subject_name(cert);
    for (const auto& [nid, type, value] : entries) {
      X509_NAME_add_entry_by_NID(name, nid, type, reinterpret_cast<const unsigned char*>(value.data()), int(value.size()), -1, 0);
    }
    X509_set_issuer_name(cert, name);
    X509_set_pubkey(cert, key);
    if (X509_sign(cert, key, EVP_sha256()) != 0) out = Der(cert);
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  return out;
}

void X509Identity(const std::string& dir) {
  char tmpl[] = "/tmp/cdp-fuzz-seeds-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "fuzz_seeds: mkdtemp failed\n");
    g_ok = false;
    return;
  }
  const std::string pki_dir = std::string(tmpl) + "/pki";
  auto der_of = [](const std::string& path) {
    Bytes b;
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      if (X509* c = PEM_read_X509(f, nullptr, nullptr, nullptr)) {
        b = Der(c);
        X509_free(c);
      }
      std::fclose(f);
    }
    return b;
  };
  if (!pki::InitCa(pki_dir, pki::CaOptions{}).ok()) g_ok = false;
  Write(dir, "ca", der_of(pki_dir + "/ca.crt"));
  struct Issued {
    const char* file;
    pki::CertRole role;
    const char* tenant;
    const char* name;
  };
  for (const Issued& i : {Issued{"agent", pki::CertRole::kAgent, "acme", "host1"},
                          Issued{"ps", pki::CertRole::kProcessServer, "acme", "ps-1.example"},
                          Issued{"mt", pki::CertRole::kMasterTarget, "", "mt.example"}}) {
    pki::IssueOptions o;
    o.identity = pki::Identity{i.role, i.tenant, i.name};
    const std::string base = std::string(tmpl) + "/" + i.file;
    if (!pki::Issue(pki_dir, o, base + ".key", base + ".crt").ok()) g_ok = false;
    Write(dir, i.file, der_of(base + ".crt"));
  }
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);

  Write(dir, "two-roles", SubjectCert({{NID_commonName, MBSTRING_UTF8, "h"}, {NID_organizationName, MBSTRING_UTF8, "acme"},
                                       {NID_organizationalUnitName, MBSTRING_UTF8, "agent"},
                                       {NID_organizationalUnitName, MBSTRING_UTF8, "ps"}}));
  Write(dir, "mt-with-tenant", SubjectCert({{NID_commonName, MBSTRING_UTF8, "mt"}, {NID_organizationName, MBSTRING_UTF8, "acme"},
                                            {NID_organizationalUnitName, MBSTRING_UTF8, "mt"}}));
  Write(dir, "bmp-names", SubjectCert({{NID_commonName, MBSTRING_BMP, std::string("\0h\0o\0s\0t", 8)},
                                       {NID_organizationName, V_ASN1_PRINTABLESTRING, "acme"},
                                       {NID_organizationalUnitName, V_ASN1_T61STRING, "agent"}}));
  Write(dir, "utf8-tenant", SubjectCert({{NID_commonName, MBSTRING_UTF8, "host"}, {NID_organizationName, MBSTRING_UTF8, "acm\xc3\xa9"},
                                         {NID_organizationalUnitName, MBSTRING_UTF8, "ps"}}));
}

// ---- frame_handshake: a flags byte (frame_handshake_fuzz.cc), then parts.

Bytes Frame(const proto::Message& m, uint64_t seq) {
  auto b = proto::EncodeMessage(m, seq);
  if (!b.ok()) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", b.status().ToString().c_str());
    g_ok = false;
  }
  return b.ok() ? *b : Bytes();
}

void FrameHandshake(const std::string& dir) {
  std::array<uint8_t, 32> nonce;
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = uint8_t(0xa0 + i);
  const Bytes hello = Frame(proto::Hello{proto::Role::kAgent, "acme", "host1", nonce}, 1);
  const Bytes hello_ps = Frame(proto::Hello{proto::Role::kProcessServer, "acme", "ps-1", nonce}, 1);
  const Bytes auth = Frame(proto::Auth{}, 2);
  const Bytes open = Frame(proto::Heartbeat{}, 3);  // what a client sends next
  // Server side.
  Write(dir, "server-smart", Cat(Bytes{0x20}, fuzz::JoinFiles({hello, open})));
  Write(dir, "server-smart-tls-ps-bytewise", Cat(Bytes{0x20 | 0x04 | 0x08 | 0x01}, fuzz::JoinFiles({hello_ps, {}})));
  Write(dir, "server-tls-mismatch", Cat(Bytes{0x20 | 0x04 | 0x02}, fuzz::JoinFiles({hello_ps, {}})));
  Write(dir, "server-wrong-proof", Cat(Bytes{0x03}, fuzz::JoinFiles({hello, auth})));
  Write(dir, "server-unknown-tenant",
        Cat(Bytes{0x20}, fuzz::JoinFiles({Frame(proto::Hello{proto::Role::kControl, "beta", "c", nonce}, 1), {}})));
  Write(dir, "server-empty-secret", Cat(Bytes{0xa0}, fuzz::JoinFiles({hello, {}})));
  Write(dir, "server-heartbeat-before-auth", Cat(Bytes{0x00}, Frame(proto::Heartbeat{}, 1)));
  Write(dir, "server-two-hellos", Cat(Bytes{0x22}, Cat(hello, hello)));
  // Client side: part 1 follows the client's Hello.
  const Bytes accepted = Frame(proto::AuthResult{true, ""}, 2);
  Write(dir, "client-smart", Cat(Bytes{0x60}, Cat(Bytes(nonce.begin(), nonce.end()), accepted)));
  Write(dir, "client-smart-ps-tls-mt", Cat(Bytes{0x60 | 0x80 | 0x04 | 0x10 | 0x02}, Cat(Bytes(nonce.begin(), nonce.end()), accepted)));
  Write(dir, "client-refused", Cat(Bytes{0x61}, Cat(Bytes(nonce.begin(), nonce.end()), Frame(proto::AuthResult{false, "no"}, 2))));
  Write(dir, "client-forged-challenge", Cat(Bytes{0x40}, Frame(proto::Challenge{nonce, nonce}, 1)));
  Write(dir, "client-tls-wrong-role", Cat(Bytes{0x40 | 0x80 | 0x04}, Frame(proto::Challenge{nonce, nonce}, 1)));
}

// ---- nbd_server: what a client sends after the server's greeting.

void NbdServerSeeds(const std::string& dir) {
  Bytes flags;
  nbd::PutBE32(flags, nbd::kClientFlagFixedNewstyle | nbd::kClientFlagNoZeroes);
  auto req = [](uint16_t type, uint16_t fl, uint64_t off, uint32_t len, uint64_t handle) {
    nbd::Request r;
    r.type = type;
    r.flags = fl;
    r.handle = handle;
    r.offset = off;
    r.length = len;
    return nbd::EncodeRequest(r);
  };
  Bytes io = Cat(req(nbd::kCmdWrite, nbd::kCmdFlagFua, 4096, 16, 1), Bytes(16, 0xab));
  io = Cat(io, req(nbd::kCmdRead, 0, 4096, 512, 2));
  io = Cat(io, req(nbd::kCmdWriteZeroes, nbd::kCmdFlagNoHole, 0, 8192, 3));
  io = Cat(io, req(nbd::kCmdTrim, 0, 8192, 4096, 4));
  io = Cat(io, req(nbd::kCmdFlush, 0, 0, 0, 5));
  const Bytes disc = req(nbd::kCmdDisc, 0, 0, 0, 6);
  Write(dir, "go-io-disc", Cat(Cat(Cat(flags, Option(nbd::kOptGo, InfoData("db1", {nbd::kInfoName, nbd::kInfoDescription}))), io), disc));
  Write(dir, "export-name-io", Cat(Cat(flags, Option(nbd::kOptExportName, B("acme/db2"))), io));
  Write(dir, "list-info-abort",
        Cat(Cat(Cat(Cat(flags, Option(nbd::kOptList, {})), Option(nbd::kOptInfo, InfoData("ro", {nbd::kInfoDescription}))),
                Option(nbd::kOptStructuredReply, {})),
            Option(nbd::kOptAbort, {})));
  Write(dir, "ro-write-refused", Cat(Cat(Cat(flags, Option(nbd::kOptGo, InfoData("ro", {}))),
                                         Cat(req(nbd::kCmdWrite, 0, 0, 8, 9), Bytes(8, 1))),
                                     req(nbd::kCmdRead, 0, 16384 - 8, 16, 10)));
  Write(dir, "write-split-and-skip",
        Cat(Cat(Cat(flags, Option(nbd::kOptGo, InfoData("", {}))), req(nbd::kCmdWrite, 0, 0, 40000, 11)), Bytes(1000, 2)));
  Write(dir, "starttls-unsupported", Cat(Cat(flags, Option(nbd::kOptStartTls, {})), Option(nbd::kOptExportName, B("nope"))));
  Write(dir, "big-option-skipped", Cat(Cat(flags, Option(nbd::kOptInfo, Bytes(9000, 0))), Option(nbd::kOptList, {})));
}

// ---- nbd_client: a flags byte, four op bytes (nbd_client_fuzz.cc), then
// what a server sends.

Bytes Reply(uint32_t error, uint64_t handle) {
  Bytes r(nbd::kSimpleReplySize);
  nbd::EncodeSimpleReply(r.data(), error, handle);
  return r;
}

void NbdClientSeeds(const std::string& dir) {
  const uint16_t tflags = nbd::kFlagHasFlags | nbd::kFlagSendFlush | nbd::kFlagSendFua | nbd::kFlagSendWriteZeroes;
  auto negotiation = [&](uint16_t flags, uint32_t max_block) {
    Bytes b = nbd::EncodeGreeting(nbd::kFlagFixedNewstyle | nbd::kFlagNoZeroes);
    b = Cat(b, nbd::EncodeOptionReply(nbd::kOptGo, nbd::kRepInfo, nbd::EncodeInfoExport(1 << 20, flags)));
    b = Cat(b, nbd::EncodeOptionReply(nbd::kOptGo, nbd::kRepInfo, nbd::EncodeInfoBlockSize(1, 4096, max_block)));
    return Cat(b, nbd::EncodeOptionReply(nbd::kOptGo, nbd::kRepAck));
  };
  // Write at 0, Read at block 1, Flush, Close (max_inflight 1): handles 1, 2, 3.
  Bytes io = Cat(Cat(Reply(0, 1), Reply(0, 2)), Bytes(4096, 0x11));
  io = Cat(io, Reply(0, 3));
  Write(dir, "write-read-flush-close", Cat(Cat(Bytes{0x00, 0x00, 0x0a, 0x04, 0x05}, negotiation(tflags, 1 << 20)), io));
  // Pipelined writes (max_inflight 16), replies out of order, one failing.
  Write(dir, "pipelined-one-fails", Cat(Cat(Bytes{0x0c, 0x00, 0x0e, 0x11, 0x03}, negotiation(tflags, 1 << 20)),
                                        Cat(Cat(Reply(0, 2), Reply(5, 1)), Reply(0, 3))));
  // A read of max_block (16 KiB) in 7-byte chunks.
  Write(dir, "read-max-block-chunked", Cat(Cat(Bytes{0x02, 0x07, 0x05, 0x05, 0x05}, negotiation(tflags, 16384)),
                                           Cat(Reply(0, 1), Bytes(16384, 0x22))));
  // Read-only, no flush: writes refused locally.
  Write(dir, "read-only", Cat(Cat(Bytes{0x00, 0x00, 0x01, 0x02, 0x04}, negotiation(nbd::kFlagHasFlags | nbd::kFlagReadOnly, 1 << 20)),
                              Cat(Reply(0, 1), Bytes(4096, 0x33))));
  // GO refused with a text carrying an escape sequence.
  Bytes refused = Cat(nbd::EncodeGreeting(nbd::kFlagFixedNewstyle),
                      nbd::EncodeOptionReply(nbd::kOptGo, nbd::kRepErrPolicy, std::string_view("cap\x1b[2Jreached")));
  Write(dir, "go-refused", Cat(Bytes{0x00, 0x00, 0x00, 0x00, 0x00}, refused));
  // A reply for a handle never sent, and a reply with a bad magic.
  Write(dir, "unknown-handle", Cat(Cat(Bytes{0x00, 0x00, 0x03, 0x00, 0x00}, negotiation(tflags, 1 << 20)), Reply(0, 99)));
  Write(dir, "bad-magic", Cat(Cat(Bytes{0x00, 0x02, 0x00, 0x00, 0x00}, negotiation(tflags, 1 << 20)), Bytes(16, 0xff)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  const std::string root = argv[1];
  ::mkdir(root.c_str(), 0755);
  NbdOption(root + "/nbd_option");
  NbdRequest(root + "/nbd_request");
  Http(root + "/http");
  Config(root + "/config");
  SegmentLog(root + "/segment_log");
  Spool(root + "/spool");
  SpoolMeta(root + "/spool_meta");
  Journal(root + "/journal");
  ControlToken(root + "/control_token");
  MtTenants(root + "/mt_tenants");
  KeyFile(root + "/key_file");
  X509Identity(root + "/x509_identity");
  FrameHandshake(root + "/frame_handshake");
  NbdServerSeeds(root + "/nbd_server");
  NbdClientSeeds(root + "/nbd_client");
  return g_ok ? 0 : 1;
}
