// SPDX-License-Identifier: Apache-2.0
// Wire protocol: byte layout, round trips of every message, incremental
// decoding, bit flips, truncation, absurd lengths and name validation.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "common/base/crc32c.h"
#include "common/wire/codec.h"
#include "common/wire/protocol.h"

namespace cdp::proto {
namespace {

Bytes PseudoRandom(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (auto& c : b) c = uint8_t(rng());
  return b;
}

Bytes Text(size_t n) {
  Bytes b;
  const std::string words = "volume flush tag seq=42 latency_us=17 ok ";
  while (b.size() < n) b.push_back(uint8_t(words[b.size() % words.size()]));
  return b;
}

Bytes ToBytes(std::string_view s) { return Bytes(s.begin(), s.end()); }

// A batch holding every record kind, contiguous from `first_seq`.
WriteBatch EveryKindBatch(Codec codec, uint64_t first_seq = 100) {
  WriteBatch wb;
  wb.volume_id = 7;
  wb.codec = codec;
  wb.level = 3;
  uint64_t s = first_seq;
  wb.records.push_back({s++, 4096, 8192, RecordKind::kData, 1'700'000'000'000'001, Text(8192)});
  wb.records.push_back({s++, 1 << 20, 65536, RecordKind::kZero, 1'700'000'000'000'002, {}});
  wb.records.push_back({s++, 2 << 20, 4096, RecordKind::kTrim, 1'700'000'000'000'003, {}});
  wb.records.push_back({s++, 0, 0, RecordKind::kFlush, 1'700'000'000'000'004, {}});
  wb.records.push_back({s++, 0, 0, RecordKind::kTag, 1'700'000'000'000'005, ToBytes("before-upgrade.1")});
  wb.records.push_back({s++, 512, 1, RecordKind::kData, 1'700'000'000'000'006, Bytes{0xAB}});
  wb.records.push_back(
      {s++, 0, 0, RecordKind::kAnomaly, 1'700'000'000'000'007, EncodeAnomaly(3, "change rate 52.3 MB/s, 97% incompressible")});
  return wb;
}

std::vector<Message> EveryMessage() {
  std::vector<Message> v;
  Hello h;
  h.role = Role::kProcessServer;
  h.tenant = "acme";
  h.client_id = "host-01.example";
  for (size_t i = 0; i < 32; ++i) h.client_nonce[i] = uint8_t(i + 1);
  v.push_back(h);
  Challenge c;
  for (size_t i = 0; i < 32; ++i) c.server_nonce[i] = uint8_t(100 + i), c.server_proof[i] = uint8_t(200 + i);
  v.push_back(c);
  Auth a;
  a.client_proof.fill(0x5A);
  v.push_back(a);
  v.push_back(AuthResult{false, "authentication failed"});
  v.push_back(AuthResult{true, ""});
  VolumeOpen vo;
  vo.name = "db_data-1";
  vo.size = 10ull << 30;
  vo.block_size = 4096;
  for (size_t i = 0; i < 16; ++i) vo.uuid[i] = uint8_t(0xF0 + i);
  vo.generation = 3;
  v.push_back(vo);
  v.push_back(VolumeOpenReply{9, 123456789012ull});
  v.push_back(EveryKindBatch(Codec::kNone));
  v.push_back(Ack{9, 0xFFFFFFFFFFFFull});
  v.push_back(Nack{9, NackReason::kGap, 1001, "expected 1001, got 1005"});
  v.push_back(HashRequest{9, 77, 1u << 20, 10, 512, 40, 0});
  v.push_back(HashRequest{9, 78, 4096, 10, 16, 40, 41});
  HashResponse behind;
  behind.volume_id = 9;
  behind.region_size = 65536;
  behind.seq = 39;
  behind.status = HashStatus::kBehind;
  v.push_back(behind);
  HashResponse hr;
  hr.volume_id = 9;
  hr.request_id = 77;
  hr.region_size = 1u << 20;
  hr.first_region = 10;
  for (uint64_t i = 0; i < 5; ++i) hr.hashes.push_back({i * 0x1111, ~i});
  hr.hashes.push_back({});  // a zero digest (its flag on the wire)
  hr.seq = 41;
  v.push_back(hr);
  v.push_back(Heartbeat{1'700'000'000'123'456, 1'700'000'000'000'001});
  Stats st;
  st.values = {{"ps.bytes_in", 1.5e9}, {"queue_depth", 3}, {"lag_s", -0.25}};
  v.push_back(st);
  v.push_back(FailbackPlanRequest{80, "db_data-1", 1234});
  v.push_back(FailbackPlan{80, FailbackStatus::kOk, {{0, 1}, {7, 300}, {1ull << 40, 2}}, (1ull << 40) + 2});
  v.push_back(FailbackPlan{81, FailbackStatus::kNotFailingBack, {}, 0});
  v.push_back(PullRequest{82, "db_data-1", {{3, 2}, {9, 1}}, {{1, 2}, {}, {5, 6}}});
  PullResponse pr{82, FailbackStatus::kOk, Codec::kZstd, 3, {}};
  pr.records.push_back({1, 3 * 4096, 4096, RecordKind::kData, 0, Text(4096)});
  pr.records.push_back({2, 9 * 4096, 4096, RecordKind::kZero, 0, {}});
  v.push_back(pr);
  v.push_back(PullResponse{83, FailbackStatus::kOk, Codec::kNone, 0, {}});
  v.push_back(PullResponse{84, FailbackStatus::kFailed, Codec::kNone, 0, {}});
  v.push_back(GroupHold{1'700'000'000'001, 200, {"db_data-1", "logs"}});
  v.push_back(GroupHold{1'700'000'000'003, 10'000, {"db_data-1"}, true});
  v.push_back(GroupHeld{1'700'000'000'001, GroupHoldStatus::kHeld, ""});
  v.push_back(GroupHeld{1'700'000'000'002, GroupHoldStatus::kRefused, "volume logs is in metadata mode"});
  v.push_back(GroupRelease{1'700'000'000'001, "group.app.1700000000001.2"});
  v.push_back(GroupRelease{1'700'000'000'002, ""});
  return v;
}

// Every field of a message, in the encoder's canonical form (uncompressed).
Bytes Canonical(Message m) {
  if (auto* wb = std::get_if<WriteBatch>(&m)) wb->codec = Codec::kNone;
  if (auto* pr = std::get_if<PullResponse>(&m)) pr->codec = Codec::kNone;
  Result<Bytes> p = EncodePayload(m);
  REQUIRE(p.ok());
  return *p;
}

Bytes FrameOf(MsgType type, const Bytes& payload, uint64_t seq = 1, uint16_t flags = 0) {
  Bytes f(kHeaderSize);
  EncodeHeader(type, flags, seq, payload, f.data());
  f.insert(f.end(), payload.begin(), payload.end());
  return f;
}

Result<Message> DecodeAndParse(const Bytes& frame) {
  Frame f;
  DecodeOutcome o = DecodeFrame(frame, &f);
  if (o.state != DecodeState::kComplete) return Status::Corruption("not complete");
  return ParseMessage(f);
}

// Runs `fn` in a child process whose address space is capped at its current
// size + 256 MiB: an attempt to allocate an absurd length kills the child
// (std::bad_alloc -> exit 2), a clean rejection exits 0. Returns the
// child's exit status (0 = fn returned true within the cap).
int RunInSmallMemory(const std::function<bool()>& fn) {
  pid_t pid = fork();
  if (pid == 0) {
    size_t vm_kb = 0;
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoul(line.substr(7));
    }
    rlimit lim{};
    lim.rlim_cur = lim.rlim_max = (vm_kb << 10) + (256ull << 20);
    if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(3);
    try {
      _exit(fn() ? 0 : 1);
    } catch (...) {
      _exit(2);  // std::bad_alloc: it tried to allocate past the cap
    }
  }
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  return 128 + WTERMSIG(wstatus);
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCanCapMemory = false;  // ASan reserves terabytes of shadow memory
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kCanCapMemory = false;
#else
constexpr bool kCanCapMemory = true;
#endif
#else
constexpr bool kCanCapMemory = true;
#endif

// A parse of `frame` must fail (and must not allocate absurd amounts).
void RequireRejectedInSmallMemory(const Bytes& frame) {
  auto check = [&frame] {
    Frame f;
    DecodeOutcome o = DecodeFrame(frame, &f);
    if (o.state == DecodeState::kBad) return true;
    if (o.state != DecodeState::kComplete) return false;
    return !ParseMessage(f).ok();
  };
  if (kCanCapMemory) {
    REQUIRE(RunInSmallMemory(check) == 0);
  } else {
    REQUIRE(check());
  }
}

Bytes BatchPayload(uint32_t volume, Codec codec, uint32_t raw_size, uint32_t count, const Bytes& block) {
  Bytes p;
  PutFixed32(p, volume);
  PutU8(p, uint8_t(codec));
  PutFixed32(p, raw_size);
  PutFixed32(p, count);
  PutBytes(p, block);
  return p;
}

void PutRecord(Bytes& b, uint64_t seq, uint64_t offset, uint32_t length, uint8_t kind, uint32_t data_len,
               const Bytes& data) {
  PutFixed64(b, seq);
  PutFixed64(b, offset);
  PutFixed32(b, length);
  PutU8(b, kind);
  PutFixed64(b, 42);
  PutFixed32(b, data_len);
  PutBytes(b, data);
}

Bytes OneRecordBatch(uint64_t seq, uint64_t offset, uint32_t length, uint8_t kind, uint32_t data_len,
                     const Bytes& data) {
  Bytes block;
  PutRecord(block, seq, offset, length, kind, data_len, data);
  return FrameOf(MsgType::kWriteBatch, BatchPayload(1, Codec::kNone, uint32_t(block.size()), 1, block));
}

TEST_CASE("header layout is explicit little-endian at the documented offsets", "[protocol]") {
  Result<Bytes> f = EncodeMessage(Heartbeat{0x0102030405060708ull, 0x1112131415161718ull}, 0xA1A2A3A4A5A6A7A8ull);
  REQUIRE(f.ok());
  const Bytes& b = *f;
  REQUIRE(b.size() == kHeaderSize + 16);
  CHECK(Bytes(b.begin(), b.begin() + 4) == Bytes{'C', 'D', 'P', 'F'});
  CHECK(b[4] == kVersion);
  CHECK(b[5] == uint8_t(MsgType::kHeartbeat));
  CHECK(DecodeFixed16(&b[6]) == 0);
  CHECK(b[8] == 16);
  CHECK(b[9] == 0);
  CHECK(b[12] == 0xA8);
  CHECK(b[19] == 0xA1);
  CHECK(b[24] == 0x08);  // sent_us, least significant byte first
  CHECK(b[31] == 0x01);
  CHECK(b[32] == 0x18);
  // CRC over the header with the crc field zeroed, then the payload.
  Bytes h(b.begin(), b.begin() + kHeaderSize);
  std::memset(&h[20], 0, 4);
  uint32_t crc = crc32c::Extend(crc32c::Value(h.data(), h.size()), b.data() + kHeaderSize, 16);
  CHECK(DecodeFixed32(&b[20]) == crc);
}

TEST_CASE("every message type round-trips", "[protocol]") {
  uint64_t seq = 1;
  for (const Message& m : EveryMessage()) {
    INFO("type " << int(TypeOf(m)));
    Result<Bytes> f = EncodeMessage(m, seq);
    REQUIRE(f.ok());
    Frame fr;
    DecodeOutcome o = DecodeFrame(*f, &fr);
    REQUIRE(o.state == DecodeState::kComplete);
    CHECK(o.consumed == f->size());
    CHECK(fr.sequence == seq);
    CHECK(fr.type == TypeOf(m));
    Result<Message> back = ParseMessage(fr);
    REQUIRE(back.ok());
    CHECK(back->index() == m.index());
    CHECK(Canonical(*back) == Canonical(m));
    ++seq;
  }
}

TEST_CASE("TypeOf matches the message's wire type", "[protocol]") {
  for (const Message& m : EveryMessage()) {
    Result<Bytes> f = EncodeMessage(m, 1);
    REQUIRE(f.ok());
    CHECK((*f)[5] == uint8_t(TypeOf(m)));
  }
  CHECK(TypeOf(Hello{}) == MsgType::kHello);
  CHECK(TypeOf(Stats{}) == MsgType::kStats);
  CHECK(TypeOf(WriteBatch{}) == MsgType::kWriteBatch);
}

TEST_CASE("write batches with every record kind round-trip with each codec", "[protocol]") {
  for (Codec codec : {Codec::kNone, Codec::kLz4, Codec::kZstd}) {
    INFO("codec " << int(codec));
    WriteBatch wb = EveryKindBatch(codec);
    Result<Bytes> f = EncodeMessage(wb, 5);
    REQUIRE(f.ok());
    Result<Message> back = DecodeAndParse(*f);
    REQUIRE(back.ok());
    const auto& got = std::get<WriteBatch>(*back);
    CHECK(got.codec == codec);  // text data compresses, so the codec is kept
    CHECK(got.volume_id == 7);
    REQUIRE(got.records.size() == wb.records.size());
    for (size_t i = 0; i < got.records.size(); ++i) {
      CHECK(got.records[i].seq == wb.records[i].seq);
      CHECK(got.records[i].offset == wb.records[i].offset);
      CHECK(got.records[i].length == wb.records[i].length);
      CHECK(got.records[i].kind == wb.records[i].kind);
      CHECK(got.records[i].timestamp_us == wb.records[i].timestamp_us);
      CHECK(got.records[i].data == wb.records[i].data);
    }
    if (codec != Codec::kNone) {
      Result<Bytes> raw = EncodeMessage(EveryKindBatch(Codec::kNone), 5);
      REQUIRE(raw.ok());
      CHECK(f->size() < raw->size());
    }
  }
}

TEST_CASE("anomaly records: back and message round-trip, and a bad one is refused", "[protocol]") {
  uint64_t back = 0;
  std::string msg;
  REQUIRE(DecodeAnomaly(EncodeAnomaly(7, "jump"), &back, &msg));
  CHECK(back == 7);
  CHECK(msg == "jump");
  // The message is capped; back 0 and short data are not anomaly records.
  REQUIRE(DecodeAnomaly(EncodeAnomaly(1, std::string(2000, 'x')), &back, &msg));
  CHECK(msg.size() == kMaxAnomalyText);
  CHECK_FALSE(DecodeAnomaly(EncodeAnomaly(0, "x"), &back, &msg));
  CHECK_FALSE(DecodeAnomaly(Bytes(7, 1), &back, &msg));
  Bytes too_long = EncodeAnomaly(1, std::string(kMaxAnomalyText, 'x'));
  too_long.push_back('y');
  CHECK_FALSE(DecodeAnomaly(too_long, &back, &msg));
  auto encode = [](Record r) {
    WriteBatch wb;
    wb.volume_id = 1;
    wb.records.push_back(std::move(r));
    return EncodeMessage(wb, 1);
  };
  // Pointing before the volume's first record, or carrying a range: refused.
  CHECK_FALSE(encode({5, 0, 0, RecordKind::kAnomaly, 0, EncodeAnomaly(6, "x")}).ok());
  CHECK(encode({5, 0, 0, RecordKind::kAnomaly, 0, EncodeAnomaly(5, "x")}).ok());
  CHECK_FALSE(encode({5, 4096, 0, RecordKind::kAnomaly, 0, EncodeAnomaly(1, "x")}).ok());
  CHECK_FALSE(encode({5, 0, 0, RecordKind::kAnomaly, 0, Bytes{1, 2, 3}}).ok());
}

TEST_CASE("incompressible batches travel uncompressed", "[protocol]") {
  WriteBatch wb;
  wb.volume_id = 1;
  wb.codec = Codec::kZstd;
  wb.records.push_back({1, 0, 65536, RecordKind::kData, 1, PseudoRandom(65536, 9)});
  Result<Bytes> f = EncodeMessage(wb, 1);
  REQUIRE(f.ok());
  CHECK((*f)[kHeaderSize + 4] == uint8_t(Codec::kNone));
  Result<Message> back = DecodeAndParse(*f);
  REQUIRE(back.ok());
  CHECK(std::get<WriteBatch>(*back).records[0].data == wb.records[0].data);
}

TEST_CASE("payload pieces are EncodePayload's bytes, with large uncompressed record data referenced in place",
          "[protocol]") {
  // Records below, at and above kInPlaceData, data and not.
  auto batch = [](Codec codec, bool random) {
    WriteBatch wb;
    wb.volume_id = 9;
    wb.codec = codec;
    wb.level = 1;
    uint64_t seq = 40;
    for (size_t len : {size_t(4096), kInPlaceData - 1, kInPlaceData, size_t(0), size_t(1) << 20, size_t(512)}) {
      if (len == 0) {
        wb.records.push_back({seq++, 0, 8192, RecordKind::kZero, 5, {}});
        continue;
      }
      wb.records.push_back({seq, seq * 4096, uint32_t(len), RecordKind::kData, 5,
                            random ? PseudoRandom(len, seq) : Text(len)});
      ++seq;
    }
    return wb;
  };
  struct Case {
    Codec codec;
    bool random;
    bool in_place;  // expected: uncompressed on the wire
  };
  for (const Case& c : {Case{Codec::kNone, false, true}, Case{Codec::kNone, true, true},
                        Case{Codec::kZstd, true, true}, Case{Codec::kLz4, true, true},
                        Case{Codec::kZstd, false, false}}) {
    INFO("codec " << int(c.codec) << (c.random ? ", random data" : ", text"));
    const Message m = batch(c.codec, c.random);
    const WriteBatch& wb = std::get<WriteBatch>(m);
    Result<Bytes> flat = EncodePayload(m);
    REQUIRE(flat.ok());
    PayloadPieces p;
    REQUIRE(EncodePayloadPieces(m, &p).ok());
    Bytes joined;
    for (ByteSpan b : p.pieces) joined.insert(joined.end(), b.begin(), b.end());
    const bool same = joined == *flat;
    CHECK(same);
    CHECK(p.size == flat->size());
    // Exactly the records of kInPlaceData bytes or more are referenced, not copied.
    size_t referenced = 0;
    for (ByteSpan b : p.pieces) {
      for (const Record& r : wb.records) {
        if (!r.data.empty() && b.data() == r.data.data() && b.size() == r.data.size()) ++referenced;
      }
    }
    CHECK(referenced == (c.in_place ? 2u : 0u));
    CHECK(p.pieces.size() == (c.in_place ? 5u : 1u));
    // The header over the pieces is the header over the flat payload.
    uint8_t h1[kHeaderSize], h2[kHeaderSize];
    EncodeHeader(MsgType::kWriteBatch, 0, 3, *flat, h1);
    EncodeHeader(MsgType::kWriteBatch, 0, 3, p.pieces, h2);
    CHECK(std::memcmp(h1, h2, kHeaderSize) == 0);
  }
  // Any other message is one piece, its whole payload.
  for (const Message& m : EveryMessage()) {
    if (std::holds_alternative<WriteBatch>(m)) continue;
    PayloadPieces p;
    REQUIRE(EncodePayloadPieces(m, &p).ok());
    REQUIRE(p.pieces.size() == 1);
    CHECK(Bytes(p.pieces[0].begin(), p.pieces[0].end()) == *EncodePayload(m));
  }
  // And it refuses what EncodePayload refuses.
  WriteBatch empty;
  PayloadPieces p;
  Status refused = EncodePayloadPieces(empty, &p);
  CHECK(refused.code() == Code::kInvalidArgument);
  CHECK(refused.message() == "cannot encode: empty write batch");
}

TEST_CASE("records holding shared bytes encode as records owning them, and large ones are framed where they lie",
          "[protocol]") {
  for (Codec codec : {Codec::kNone, Codec::kZstd}) {
    INFO("codec " << int(codec));
    WriteBatch owned;
    owned.volume_id = 3;
    owned.codec = codec;
    owned.level = 1;
    uint64_t seq = 7;
    for (size_t len : {size_t(4096), size_t(1) << 20, kInPlaceData}) {
      // zstd compresses text: the block then travels compressed, not in place.
      owned.records.push_back({seq, seq * 4096, uint32_t(len), RecordKind::kData, 11,
                               codec == Codec::kNone ? PseudoRandom(len, seq) : Text(len)});
      ++seq;
    }
    owned.records.push_back({seq, 0, 0, RecordKind::kTag, 11, Text(5)});
    WriteBatch shared = owned;
    for (Record& r : shared.records) {
      r.shared = std::make_shared<const Bytes>(std::move(r.data));
      r.data.clear();
    }
    const Message mo{owned}, ms{shared};
    Result<Bytes> a = EncodePayload(mo), b = EncodePayload(ms);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    const bool same = *a == *b;
    CHECK(same);
    PayloadPieces p;
    REQUIRE(EncodePayloadPieces(ms, &p).ok());
    Bytes joined;
    for (ByteSpan piece : p.pieces) joined.insert(joined.end(), piece.begin(), piece.end());
    const bool pieces_same = joined == *a;
    CHECK(pieces_same);
    size_t referenced = 0;
    for (ByteSpan piece : p.pieces) {
      for (const Record& r : shared.records) referenced += piece.data() == r.shared->data() ? 1 : 0;
    }
    CHECK(referenced == (codec == Codec::kNone ? 2u : 0u));  // the 1 MiB and the kInPlaceData record
    // What the receiver parses owns its bytes.
    Result<Bytes> frame = EncodeMessage(ms, 1);
    REQUIRE(frame.ok());
    Result<Message> back = DecodeAndParse(*frame);
    REQUIRE(back.ok());
    const WriteBatch& got = std::get<WriteBatch>(*back);
    REQUIRE(got.records.size() == owned.records.size());
    for (size_t i = 0; i < got.records.size(); ++i) {
      CHECK(got.records[i].shared == nullptr);
      CHECK(got.records[i].data == owned.records[i].data);
    }
  }
}

TEST_CASE("the decoder fed one byte at a time yields the same frames", "[protocol]") {
  Bytes stream;
  std::vector<Bytes> frames;
  uint64_t seq = 1;
  std::vector<Message> msgs = EveryMessage();
  msgs.push_back(EveryKindBatch(Codec::kZstd, 1000));
  msgs.push_back(EveryKindBatch(Codec::kLz4, 2000));
  for (const Message& m : msgs) {
    Result<Bytes> f = EncodeMessage(m, seq++);
    REQUIRE(f.ok());
    frames.push_back(*f);
    stream.insert(stream.end(), f->begin(), f->end());
  }
  Bytes buf;
  size_t next = 0;
  for (uint8_t byte : stream) {
    buf.push_back(byte);
    Frame fr;
    DecodeOutcome o = DecodeFrame(buf, &fr);
    REQUIRE(o.state != DecodeState::kBad);
    if (o.state == DecodeState::kNeedMore) {
      CHECK(o.consumed == 0);
      continue;
    }
    REQUIRE(next < frames.size());
    REQUIRE(o.consumed == buf.size());  // complete exactly at the frame's last byte
    CHECK(buf == frames[next]);
    CHECK(fr.sequence == next + 1);
    Result<Message> m = ParseMessage(fr);
    REQUIRE(m.ok());
    CHECK(Canonical(*m) == Canonical(msgs[next]));
    buf.erase(buf.begin(), buf.begin() + long(o.consumed));
    ++next;
  }
  CHECK(next == frames.size());
  CHECK(buf.empty());
}

TEST_CASE("every single-bit flip anywhere in a frame is detected", "[protocol]") {
  std::vector<Message> msgs = {EveryMessage()[0], EveryMessage()[5], EveryMessage()[13]};
  WriteBatch small;
  small.volume_id = 3;
  small.codec = Codec::kZstd;
  small.records.push_back({1, 0, 512, RecordKind::kData, 9, Text(512)});
  small.records.push_back({2, 0, 0, RecordKind::kTag, 9, ToBytes("t1")});
  msgs.push_back(small);
  msgs.push_back(EveryKindBatch(Codec::kNone));
  msgs.push_back(EveryKindBatch(Codec::kLz4));
  size_t flips = 0, expected_flips = 0;
  for (const Message& m : msgs) {
    Result<Bytes> f = EncodeMessage(m, 77);
    REQUIRE(f.ok());
    expected_flips += f->size() * 8;
    for (size_t bit = 0; bit < f->size() * 8; ++bit) {
      Bytes g = *f;
      g[bit / 8] ^= uint8_t(1u << (bit % 8));
      Frame fr;
      DecodeOutcome o = DecodeFrame(g, &fr);
      INFO("bit " << bit);
      REQUIRE(o.state != DecodeState::kComplete);
      if (o.state == DecodeState::kNeedMore) {
        // Only a flip that enlarges the length field can ask for more; once
        // the bytes it asks for arrive, the CRC rejects the frame.
        REQUIRE((bit / 8 >= 8 && bit / 8 < 12));
        uint32_t want = DecodeFixed32(&g[8]);
        g.resize(kHeaderSize + want, 0);
        REQUIRE(DecodeFrame(g, &fr).state == DecodeState::kBad);
      }
      ++flips;
    }
  }
  CHECK(flips == expected_flips);
  CHECK(flips > 70000);
}

TEST_CASE("truncated frames need more and never consume", "[protocol]") {
  for (const Message& m : EveryMessage()) {
    Result<Bytes> f = EncodeMessage(m, 3);
    REQUIRE(f.ok());
    for (size_t n = 0; n < f->size(); ++n) {
      Frame fr;
      DecodeOutcome o = DecodeFrame(ByteSpan(f->data(), n), &fr);
      REQUIRE(o.state == DecodeState::kNeedMore);
      REQUIRE(o.consumed == 0);
    }
  }
}

TEST_CASE("garbage, unknown version, type or flags are bad at once", "[protocol]") {
  Frame fr;
  CHECK(DecodeFrame(ToBytes("G"), &fr).state == DecodeState::kBad);
  CHECK(DecodeFrame(ToBytes("GET / HTTP/1.1\r\n"), &fr).state == DecodeState::kBad);
  Result<Bytes> f = EncodeMessage(Heartbeat{1, 2}, 1);
  REQUIRE(f.ok());
  Bytes v = *f;
  v[4] = 2;
  CHECK(DecodeFrame(ByteSpan(v.data(), 5), &fr).state == DecodeState::kBad);
  Bytes t = *f;
  t[5] = 0;
  CHECK(DecodeFrame(ByteSpan(t.data(), 6), &fr).state == DecodeState::kBad);
  t[5] = 14;
  CHECK(DecodeFrame(t, &fr).state == DecodeState::kBad);
  // A correctly checksummed frame with unknown flags is still refused.
  Bytes payload(f->begin() + kHeaderSize, f->end());
  CHECK(DecodeFrame(FrameOf(MsgType::kHeartbeat, payload, 1, 0x0001), &fr).state == DecodeState::kBad);
  CHECK(DecodeFrame(FrameOf(MsgType::kHeartbeat, payload, 1, 0x8000), &fr).state == DecodeState::kBad);
  // max_payload is honoured.
  CHECK(DecodeFrame(*f, &fr, 15).state == DecodeState::kBad);
  CHECK(DecodeFrame(*f, &fr, 16).state == DecodeState::kComplete);
}

TEST_CASE("absurd lengths are rejected without allocating them", "[protocol]") {
  SECTION("frame length 0xFFFFFFFF") {
    Bytes h(kHeaderSize);
    EncodeFixed32(&h[0], kMagic);
    h[4] = kVersion;
    h[5] = uint8_t(MsgType::kWriteBatch);
    EncodeFixed32(&h[8], 0xFFFFFFFFu);
    Frame fr;
    DecodeOutcome o = DecodeFrame(h, &fr);
    CHECK(o.state == DecodeState::kBad);
    EncodeFixed32(&h[8], kMaxPayload + 1);
    CHECK(DecodeFrame(h, &fr).state == DecodeState::kBad);
    RequireRejectedInSmallMemory(h);
  }
  SECTION("record count 2^31") {
    Bytes block;
    PutRecord(block, 1, 0, 4, 1, 4, Bytes{1, 2, 3, 4});
    RequireRejectedInSmallMemory(FrameOf(
        MsgType::kWriteBatch, BatchPayload(1, Codec::kNone, uint32_t(block.size()), 1u << 31, block)));
    // Also a count within kMaxRecords that the block cannot hold.
    RequireRejectedInSmallMemory(FrameOf(
        MsgType::kWriteBatch, BatchPayload(1, Codec::kNone, uint32_t(block.size()), kMaxRecords, block)));
  }
  SECTION("raw_size 4 GiB") {
    Bytes block;
    PutRecord(block, 1, 0, 4, 1, 4, Bytes{1, 2, 3, 4});
    Bytes compressed;
    REQUIRE(NewCodec(Codec::kZstd)->Compress(block, &compressed).ok());
    RequireRejectedInSmallMemory(
        FrameOf(MsgType::kWriteBatch, BatchPayload(1, Codec::kZstd, 0xFFFFFFFFu, 1, compressed)));
    RequireRejectedInSmallMemory(
        FrameOf(MsgType::kWriteBatch, BatchPayload(1, Codec::kLz4, kMaxBatchRaw + 1, 1, compressed)));
  }
  SECTION("record length and data_len 4 GiB") {
    RequireRejectedInSmallMemory(OneRecordBatch(1, 0, 0xFFFFFFFFu, 1, 0xFFFFFFFFu, Bytes(16, 7)));
    RequireRejectedInSmallMemory(OneRecordBatch(1, 0, 16, 1, 0xFFFFFFFFu, Bytes(16, 7)));
  }
  SECTION("hash count 2^31 and stats count 2^31") {
    Bytes p;
    PutFixed32(p, 1);
    PutFixed64(p, 1);
    PutFixed32(p, 4096);
    PutFixed64(p, 0);
    PutFixed64(p, 0);
    p.push_back(0);
    PutFixed32(p, 1u << 31);
    RequireRejectedInSmallMemory(FrameOf(MsgType::kHashResponse, p));
    Bytes s;
    PutFixed32(s, 1u << 31);
    RequireRejectedInSmallMemory(FrameOf(MsgType::kStats, s));
  }
}

TEST_CASE("the small-memory check catches a large allocation", "[protocol]") {
  if (!kCanCapMemory) return;
  CHECK(RunInSmallMemory([] { return true; }) == 0);
  CHECK(RunInSmallMemory([] {
          Bytes big(1ull << 30, 1);
          return big[12345] == 1;
        }) != 0);
}

TEST_CASE("a zero record of 4 GiB - 1 is a valid range, not an allocation", "[protocol]") {
  Result<Message> m = DecodeAndParse(OneRecordBatch(1, 0, 0xFFFFFFFFu, 2, 0, {}));
  REQUIRE(m.ok());
  CHECK(std::get<WriteBatch>(*m).records[0].length == 0xFFFFFFFFu);
}

TEST_CASE("a decompression bomb is refused", "[protocol]") {
  // 16 MiB of zeros compresses to a few hundred bytes; declaring 4 KiB must fail.
  Bytes block;
  PutRecord(block, 1, 0, 16u << 20, 1, 16u << 20, Bytes(16u << 20, 0));
  for (Codec codec : {Codec::kLz4, Codec::kZstd}) {
    Bytes compressed;
    REQUIRE(NewCodec(codec)->Compress(block, &compressed).ok());
    CHECK(compressed.size() < 200'000);
    RequireRejectedInSmallMemory(FrameOf(MsgType::kWriteBatch, BatchPayload(1, codec, 4096, 1, compressed)));
    // Declared honestly it parses.
    Result<Message> m =
        DecodeAndParse(FrameOf(MsgType::kWriteBatch, BatchPayload(1, codec, uint32_t(block.size()), 1, compressed)));
    REQUIRE(m.ok());
    CHECK(std::get<WriteBatch>(*m).records[0].data.size() == 16u << 20);
  }
}

TEST_CASE("invalid records are parse errors", "[protocol]") {
  auto rejected = [](const Bytes& frame) {
    Result<Message> m = DecodeAndParse(frame);
    return !m.ok() && m.status().IsCorruption();
  };
  const Bytes four{1, 2, 3, 4};
  CHECK(!rejected(OneRecordBatch(1, 0, 4, 1, 4, four)));        // the valid baseline
  CHECK(rejected(OneRecordBatch(0, 0, 4, 1, 4, four)));         // sequence 0
  CHECK(rejected(OneRecordBatch(1, 0, 4, 0, 4, four)));         // unknown kind 0
  CHECK(rejected(OneRecordBatch(1, 0, 4, 8, 4, four)));         // unknown kind 8
  CHECK(rejected(OneRecordBatch(1, 0, 5, 1, 4, four)));         // data_len != length
  CHECK(rejected(OneRecordBatch(1, 0, 0, 1, 0, {})));           // data of length 0
  CHECK(rejected(OneRecordBatch(1, 0, kMaxRecordLength + 1, 1, 4, four)));
  CHECK(rejected(OneRecordBatch(1, 0, 4, 2, 4, four)));         // zero with data
  CHECK(rejected(OneRecordBatch(1, 0, 0, 3, 0, {})));           // trim of length 0
  CHECK(rejected(OneRecordBatch(1, 8, 0, 4, 0, {})));           // flush with an offset
  CHECK(rejected(OneRecordBatch(1, 0, 8, 4, 0, {})));           // flush with a length
  CHECK(rejected(OneRecordBatch(1, 0, 0, 5, 4, ToBytes("../x"))));  // tag with a bad name
  CHECK(rejected(OneRecordBatch(1, 0, 0, 5, 0, {})));           // tag without a name
  CHECK(!rejected(OneRecordBatch(1, 0, 0, 5, 4, ToBytes("tag1"))));
  // Sealed records: whole 4 KiB blocks, the blocks then one 16-byte MAC each.
  const Bytes sealed(4096 + 16, 7), macs(32, 9);
  CHECK(!rejected(OneRecordBatch(1, 4096, 4096, 6, 4096 + 16, sealed)));
  CHECK(rejected(OneRecordBatch(1, 4096, 4096, 6, 4096, Bytes(4096, 7))));  // no MAC
  CHECK(rejected(OneRecordBatch(1, 512, 4096, 6, 4096 + 16, sealed)));      // not on a block
  CHECK(rejected(OneRecordBatch(1, 0, 0, 6, 0, {})));                        // empty
  CHECK(!rejected(OneRecordBatch(1, 8192, 8192, 7, 32, macs)));
  CHECK(rejected(OneRecordBatch(1, 8192, 8192, 7, 16, Bytes(16, 9))));      // one MAC for two blocks
  CHECK(rejected(OneRecordBatch(1, 8192, 4000, 7, 16, Bytes(16, 9))));      // part of a block
  CHECK(rejected(OneRecordBatch(1, ~0ull - 3, 4, 1, 4, four)));  // offset + length overflows
  CHECK(!rejected(OneRecordBatch(1, ~0ull - 4, 4, 1, 4, four)));

  // Sequences must be contiguous.
  Bytes block;
  PutRecord(block, 10, 0, 4, 1, 4, four);
  PutRecord(block, 12, 0, 4, 1, 4, four);
  CHECK(rejected(FrameOf(MsgType::kWriteBatch, BatchPayload(1, Codec::kNone, uint32_t(block.size()), 2, block))));
  Bytes good;
  PutRecord(good, 10, 0, 4, 1, 4, four);
  PutRecord(good, 11, 0, 4, 1, 4, four);
  CHECK(!rejected(FrameOf(MsgType::kWriteBatch, BatchPayload(1, Codec::kNone, uint32_t(good.size()), 2, good))));
  // Count disagreeing with the block, raw_size disagreeing, unknown codec, empty batch.
  CHECK(rejected(FrameOf(MsgType::kWriteBatch, BatchPayload(1, Codec::kNone, uint32_t(good.size()), 1, good))));
  CHECK(rejected(FrameOf(MsgType::kWriteBatch, BatchPayload(1, Codec::kNone, uint32_t(good.size()) - 1, 2, good))));
  CHECK(rejected(FrameOf(MsgType::kWriteBatch, BatchPayload(1, Codec(3), uint32_t(good.size()), 2, good))));
  CHECK(rejected(FrameOf(MsgType::kWriteBatch, BatchPayload(1, Codec::kNone, 0, 0, {}))));
  // Trailing bytes after a fixed-size message.
  Bytes hb;
  PutFixed64(hb, 1);
  PutFixed64(hb, 2);
  CHECK(!rejected(FrameOf(MsgType::kHeartbeat, hb)));
  hb.push_back(0);
  CHECK(rejected(FrameOf(MsgType::kHeartbeat, hb)));
}

TEST_CASE("a sealed volume open carries a flags byte, an unsealed one is encoded as before", "[protocol]") {
  VolumeOpen vo;
  vo.name = "vol";
  vo.size = 1 << 20;
  vo.generation = 3;
  Result<Bytes> plain = EncodeMessage(vo, 1);
  vo.sealed = true;
  Result<Bytes> sealed = EncodeMessage(vo, 1);
  REQUIRE((plain.ok() && sealed.ok()));
  CHECK(sealed->size() == plain->size() + 1);
  CHECK(sealed->back() == 1);
  Result<Message> back = DecodeAndParse(*sealed);
  REQUIRE(back.ok());
  CHECK(std::get<VolumeOpen>(*back).sealed);
  CHECK(!std::get<VolumeOpen>(DecodeAndParse(*plain).value()).sealed);
  // Unknown flag bits and bytes after the flags are refused.
  Frame fr;
  REQUIRE(DecodeFrame(*sealed, &fr).state == DecodeState::kComplete);
  Bytes p(fr.payload.begin(), fr.payload.end());
  p.back() = 5;  // bit 2: unknown
  CHECK(DecodeAndParse(FrameOf(MsgType::kVolumeOpen, p)).status().message().find("unknown flags") !=
        std::string::npos);
  p.back() = 1;
  p.push_back(0);
  CHECK(!DecodeAndParse(FrameOf(MsgType::kVolumeOpen, p)).ok());
  // A sealed volume is whole 4 KiB blocks.
  vo.block_size = 512;
  vo.size = 4096 + 512;
  CHECK(!EncodeMessage(vo, 1).ok());
}

TEST_CASE("a volume open carries the agent's acknowledged sequence after the flags, only when it has one",
          "[protocol]") {
  VolumeOpen vo;
  vo.name = "vol";
  vo.size = 1 << 20;
  vo.generation = 2;
  Result<Bytes> plain = EncodeMessage(vo, 1);
  vo.acked_seq = 0x0102030405060708ull;
  Result<Bytes> acked = EncodeMessage(vo, 1);
  vo.sealed = true;
  Result<Bytes> both = EncodeMessage(vo, 1);
  REQUIRE((plain.ok() && acked.ok() && both.ok()));
  CHECK(acked->size() == plain->size() + 9);
  CHECK(both->size() == plain->size() + 9);
  for (const Bytes* f : {&*acked, &*both}) {
    Result<Message> back = DecodeAndParse(*f);
    REQUIRE(back.ok());
    CHECK(std::get<VolumeOpen>(*back).acked_seq == 0x0102030405060708ull);
    CHECK(std::get<VolumeOpen>(*back).sealed == (f == &*both));
  }
  CHECK(std::get<VolumeOpen>(DecodeAndParse(*plain).value()).acked_seq == 0);
  Frame fr;
  REQUIRE(DecodeFrame(*acked, &fr).state == DecodeState::kComplete);
  const Bytes p(fr.payload.begin(), fr.payload.end());
  auto refused = [](Bytes payload) {
    Result<Message> m = DecodeAndParse(FrameOf(MsgType::kVolumeOpen, payload));
    return m.ok() ? std::string("accepted") : m.status().message();
  };
  // Truncated, zero, followed by more bytes, or a flags byte with no flag: refused.
  CHECK(refused(Bytes(p.begin(), p.end() - 1)).find("bad acknowledged sequence") != std::string::npos);
  Bytes zero = p;
  std::fill(zero.end() - 8, zero.end(), uint8_t{0});
  CHECK(refused(zero).find("bad acknowledged sequence") != std::string::npos);
  Bytes more = p;
  more.push_back(0);
  CHECK(refused(more).find("bytes after the flags") != std::string::npos);
  Bytes no_flag(p.begin(), p.end() - 8);
  no_flag.back() = 0;
  CHECK(refused(no_flag).find("a flags byte with no flag") != std::string::npos);
}

TEST_CASE("sealed records round-trip and count their MACs as work", "[protocol]") {
  WriteBatch wb;
  wb.volume_id = 2;
  wb.records.push_back({5, 8192, 8192, RecordKind::kSealed, 1, PseudoRandom(8192 + 32, 1)});
  wb.records.push_back({6, 0, 4096, RecordKind::kSealedZero, 2, PseudoRandom(16, 2)});
  Result<Bytes> f = EncodeMessage(wb, 1);
  REQUIRE(f.ok());
  Result<Message> back = DecodeAndParse(*f);
  REQUIRE(back.ok());
  const auto& got = std::get<WriteBatch>(*back);
  REQUIRE(got.records.size() == 2);
  CHECK(got.records[0].data == wb.records[0].data);
  CHECK(got.records[1].kind == RecordKind::kSealedZero);
  CHECK(got.records[1].data == wb.records[1].data);
  CHECK(BatchWork(wb.records) == 8192 + 32 + 4096 + 16);
  CHECK(IsWriteKind(RecordKind::kSealed));
  CHECK(IsZeroKind(RecordKind::kSealedZero));
  CHECK(!IsZeroKind(RecordKind::kSealed));
  CHECK(!IsWriteKind(RecordKind::kTag));
}

TEST_CASE("the encoder refuses what the parser would refuse", "[protocol]") {
  WriteBatch wb = EveryKindBatch(Codec::kNone);
  wb.records[2].seq += 1;
  CHECK(EncodeMessage(wb, 1).status().code() == Code::kInvalidArgument);
  wb = EveryKindBatch(Codec::kNone);
  wb.records[0].data.pop_back();
  CHECK(EncodeMessage(wb, 1).status().code() == Code::kInvalidArgument);
  wb = EveryKindBatch(Codec::kNone);
  wb.records[4].data = ToBytes("a/b");
  CHECK(EncodeMessage(wb, 1).status().code() == Code::kInvalidArgument);
  CHECK(EncodeMessage(WriteBatch{}, 1).status().code() == Code::kInvalidArgument);
  VolumeOpen vo;
  vo.name = "v";
  vo.size = 4096 * 3;
  vo.block_size = 3000;
  CHECK(!EncodeMessage(vo, 1).ok());
  vo.block_size = 4096;
  CHECK(EncodeMessage(vo, 1).ok());
  vo.size = 4097;
  CHECK(!EncodeMessage(vo, 1).ok());
  CHECK(!EncodeMessage(Nack{1, NackReason::kGap, 0, std::string(kMaxTextLength + 1, 'x')}, 1).ok());
  CHECK(!EncodeMessage(HashRequest{1, 1, 1000, 0, 1}, 1).ok());
  CHECK(!EncodeMessage(HashRequest{1, 1, 2048, 0, 1}, 1).ok());
  CHECK(!EncodeMessage(HashRequest{1, 1, 4096, 0, 1, 10, 9}, 1).ok());
  CHECK(!EncodeMessage(HashRequest{1, 1, 4096, 0, kMaxHashes + 1}, 1).ok());
  CHECK(!EncodeMessage(HashRequest{1, 1, 4096, ~0ull, 1}, 1).ok());
}

TEST_CASE("group messages: a bad round, timeout, volume list or marker is refused both ways", "[protocol]") {
  auto encodes = [](const Message& m) { return EncodePayload(m).ok(); };
  CHECK_FALSE(encodes(GroupHold{0, 200, {"a"}}));
  CHECK_FALSE(encodes(GroupHold{1, 0, {"a"}}));
  CHECK_FALSE(encodes(GroupHold{1, kMaxGroupHoldMs + 1, {"a"}}));
  CHECK_FALSE(encodes(GroupHold{1, 200, {}}));
  CHECK_FALSE(encodes(GroupHold{1, 200, {"bad name"}}));
  CHECK_FALSE(encodes(GroupHold{1, 200, std::vector<std::string>(kMaxGroupVolumes + 1, "v")}));
  CHECK_FALSE(encodes(GroupRelease{1, "not a name!"}));
  CHECK(encodes(GroupRelease{1, ""}));
  // The parser refuses the same, and a volume named twice, built by hand.
  auto hold = [](uint64_t round, uint32_t timeout, std::vector<std::string> names, int freeze = 0) {
    Bytes p;
    PutFixed64(p, round);
    PutFixed32(p, timeout);
    PutFixed32(p, uint32_t(names.size()));
    for (const std::string& n : names) {
      PutFixed16(p, uint16_t(n.size()));
      PutBytes(p, n);
    }
    if (freeze >= 0) p.push_back(uint8_t(freeze));
    return FrameOf(MsgType::kGroupHold, p);
  };
  auto parses = [](const Bytes& frame) {
    Frame f;
    REQUIRE(DecodeFrame(frame, &f).state == DecodeState::kComplete);
    return ParseMessage(f);
  };
  REQUIRE(parses(hold(5, 200, {"a", "b"})).ok());
  auto frozen = parses(hold(5, 200, {"a"}, 1));
  REQUIRE(frozen.ok());
  CHECK(std::get<GroupHold>(*frozen).freeze);
  CHECK(parses(hold(5, 200, {"a"}, 2)).status().ToString().find("unknown freeze value") != std::string::npos);
  CHECK(parses(hold(5, 200, {"a"}, -1)).status().ToString().find("truncated group hold") != std::string::npos);
  CHECK(parses(hold(5, 200, {"a", "a"})).status().ToString().find("named twice") != std::string::npos);
  CHECK_FALSE(parses(hold(0, 200, {"a"})).ok());
  CHECK_FALSE(parses(hold(5, kMaxGroupHoldMs + 1, {"a"})).ok());
  CHECK_FALSE(parses(hold(5, 200, {})).ok());
  CHECK_FALSE(parses(hold(5, 200, {"-x"})).ok());
  Bytes huge;  // a count far beyond the bytes that follow: refused before reserving
  PutFixed64(huge, 5);
  PutFixed32(huge, 200);
  PutFixed32(huge, 0xFFFFFFFFu);
  CHECK_FALSE(parses(FrameOf(MsgType::kGroupHold, huge)).ok());
  Bytes held;
  PutFixed64(held, 5);
  PutU8(held, 7);  // no such status
  PutFixed16(held, 0);
  CHECK_FALSE(parses(FrameOf(MsgType::kGroupHeld, held)).ok());
  Bytes rel;
  PutFixed64(rel, 5);
  PutFixed16(rel, 3);
  PutBytes(rel, std::string("a b"));
  CHECK_FALSE(parses(FrameOf(MsgType::kGroupRelease, rel)).ok());
}

TEST_CASE("failback messages: bad extents, counts and records are refused both ways", "[protocol]") {
  auto encodes = [](const Message& m) { return EncodePayload(m).ok(); };
  // Extents must be non-empty, sorted and disjoint.
  CHECK_FALSE(encodes(FailbackPlan{1, FailbackStatus::kOk, {{5, 0}}, 0}));
  CHECK_FALSE(encodes(FailbackPlan{1, FailbackStatus::kOk, {{5, 2}, {6, 1}}, 0}));
  CHECK_FALSE(encodes(FailbackPlan{1, FailbackStatus::kOk, {{9, 1}, {2, 1}}, 0}));
  CHECK_FALSE(encodes(FailbackPlan{1, FailbackStatus::kFailed, {{1, 1}}, 0}));
  CHECK_FALSE(encodes(PullRequest{1, "v", {}, {}}));
  CHECK_FALSE(encodes(PullRequest{1, "v", {{0, 2}}, {{1, 1}}}));  // one digest per block
  CHECK_FALSE(encodes(PullRequest{1, "v", {{0, kMaxPullBlocks + 1}}, std::vector<Hash128>(kMaxPullBlocks + 1)}));
  PullResponse bad_seq{1, FailbackStatus::kOk, Codec::kNone, 0, {}};
  bad_seq.records.push_back({2, 0, 4096, RecordKind::kZero, 0, {}});
  CHECK_FALSE(encodes(bad_seq));
  PullResponse trim{1, FailbackStatus::kOk, Codec::kNone, 0, {}};
  trim.records.push_back({1, 0, 4096, RecordKind::kTrim, 0, {}});
  CHECK_FALSE(encodes(trim));

  // The parser refuses the same shapes when a peer sends them.
  auto parse = [](MsgType t, const Bytes& payload) { return DecodeAndParse(FrameOf(t, payload)); };
  Bytes overlap;
  PutFixed64(overlap, 1);
  overlap.push_back(0);
  PutFixed64(overlap, 0);
  PutFixed32(overlap, 2);
  PutFixed64(overlap, 4), PutFixed32(overlap, 4);
  PutFixed64(overlap, 6), PutFixed32(overlap, 1);
  Result<Message> r = parse(MsgType::kFailbackPlan, overlap);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "bad message: failback plan: bad extents");
  // A count far beyond the bytes present is refused before allocating.
  Bytes huge;
  PutFixed64(huge, 1);
  PutFixed16(huge, 1), huge.push_back('v');  // the volume name
  PutFixed32(huge, 1);
  PutFixed64(huge, 0), PutFixed32(huge, 0xFFFFFFFFu);
  r = parse(MsgType::kPullRequest, huge);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "bad message: pull request: more than kMaxPullBlocks blocks");
  // Fewer digests than blocks.
  Result<Bytes> ok = EncodePayload(PullRequest{1, "v", {{0, 3}}, {{1, 1}, {2, 2}, {3, 3}}});
  REQUIRE(ok.ok());
  Bytes shortened(ok->begin(), ok->end() - 17);
  r = parse(MsgType::kPullRequest, shortened);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "bad message: pull request: bad digest");
  // Records with an error status.
  Result<Bytes> with_records = EncodePayload(EveryMessage()[EveryMessage().size() - 3]);
  REQUIRE(with_records.ok());
  (*with_records)[8] = uint8_t(FailbackStatus::kFailed);
  r = parse(MsgType::kPullResponse, *with_records);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "bad message: pull response: records with an error");
}

TEST_CASE("bad names are rejected", "[protocol]") {
  for (const std::string& bad : {std::string("../x"), std::string(""), std::string(200, 'a'), std::string("a/b"),
                                std::string(".hidden"), std::string("-opt"), std::string("a b"),
                                std::string("a\0b", 3), std::string(kMaxNameLength + 1, 'n')}) {
    INFO("name '" << bad << "'");
    CHECK(!ValidName(bad));
    Hello h;
    h.tenant = bad;
    h.client_id = "c";
    CHECK(EncodeMessage(h, 1).status().code() == Code::kInvalidArgument);
    VolumeOpen vo;
    vo.name = bad;
    vo.size = 4096;
    CHECK(EncodeMessage(vo, 1).status().code() == Code::kInvalidArgument);
    // Hand-built Hello carrying the bad tenant: the parser refuses it.
    Bytes p;
    PutU8(p, 1);
    PutFixed16(p, uint16_t(bad.size()));
    PutBytes(p, bad);
    PutFixed16(p, 1);
    PutBytes(p, std::string_view("c"));
    PutBytes(p, Bytes(32, 0));
    Result<Message> m = DecodeAndParse(FrameOf(MsgType::kHello, p));
    CHECK(!m.ok());
  }
  for (const std::string& good : std::vector<std::string>{"a", "acme", "db_data-1", "Tenant.01",
                                                          std::string(kMaxNameLength, 'z')}) {
    CHECK(ValidName(good));
  }
}

}  // namespace
}  // namespace cdp::proto

namespace cdp::proto {

TEST_CASE("work cap: sources cut a batch of trims at kMaxBatchWork (256 MiB), keeping at least one record",
          "[protocol][workcap]") {
  STATIC_REQUIRE(kMaxBatchWork == (256ull << 20));
  std::vector<Record> recs;
  for (uint64_t i = 0; i < 9; ++i) {
    Record r;
    r.seq = i + 1;
    r.offset = i * kMaxRecordLength;
    r.length = kMaxRecordLength;
    r.kind = RecordKind::kTrim;
    recs.push_back(r);
  }
  Record flush;
  flush.seq = 10;
  flush.kind = RecordKind::kFlush;
  recs.push_back(flush);
  CHECK(BatchWork(recs) == 9 * uint64_t(kMaxRecordLength));
  CutToWorkCap(&recs);
  REQUIRE(recs.size() == 8);
  CHECK(BatchWork(recs) == kMaxBatchWork);
  std::vector<Record> one(recs.begin(), recs.begin() + 1);
  CutToWorkCap(&one);
  CHECK(one.size() == 1);
}

}  // namespace cdp::proto

TEST_CASE("MergeExtents sorts, merges overlapping and touching extents, and drops empty ones", "[protocol]") {
  CHECK(cdp::proto::MergeExtents({}).empty());
  CHECK(cdp::proto::MergeExtents({{9, 1}, {0, 2}, {2, 3}, {4, 2}, {7, 0}, {20, 5}, {21, 1}}) ==
        std::vector<cdp::proto::BlockExtent>{{0, 6}, {9, 1}, {20, 5}});
  // An extent never grows past 2^32 - 1 blocks: the rest starts a new one.
  CHECK(cdp::proto::MergeExtents({{0, 0xFFFFFFFFu}, {10, 0xFFFFFFFFu}}) ==
        std::vector<cdp::proto::BlockExtent>{{0, 0xFFFFFFFFu}, {0xFFFFFFFFull, 10}});
}
