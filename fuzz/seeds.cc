// Writes the seed corpora of the fuzz targets (fuzz/targets.cmake) except
// protocol (fuzz/make_seeds.cc): `fuzz_seeds DIR` fills DIR/<target>/ with a
// few well-formed inputs of each, so that short runs start past the magics and
// CRCs. Multi-file inputs are joined with fuzz::JoinFiles.
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/nbd_proto.h"
#include "common/segment_log.h"
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
        // A sealed volume's records (common/seal.h): blocks then MACs, or MACs alone.
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
  return g_ok ? 0 : 1;
}
