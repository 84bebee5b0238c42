// SPDX-License-Identifier: Apache-2.0
// Writes a seed corpus for protocol_fuzz into the directory given as argv[1]:
// one complete frame of every message type (frame-<type>) and the same
// messages in the fuzzer's "type byte + payload" form (payload-<type>).
#include <cstdio>
#include <string>
#include <vector>

#include "common/wire/protocol.h"

using namespace cdp;
using namespace cdp::proto;

namespace {

bool WriteFile(const std::string& path, const Bytes& b) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = std::fwrite(b.data(), 1, b.size(), f) == b.size();
  return std::fclose(f) == 0 && ok;
}

std::vector<Message> Samples() {
  std::vector<Message> v;
  Hello h;
  h.tenant = "acme";
  h.client_id = "host-1";
  v.push_back(h);
  v.push_back(Challenge{});
  v.push_back(Auth{});
  v.push_back(AuthResult{false, "authentication failed"});
  VolumeOpen vo;
  vo.name = "vol1";
  vo.size = 1 << 30;
  v.push_back(vo);
  vo.sealed = true;  // a sealed volume's open carries its flags byte
  v.push_back(vo);
  vo.acked_seq = 4411;  // and an agent's acknowledged sequence after it
  v.push_back(vo);
  v.push_back(VolumeOpenReply{1, 10});
  for (Codec codec : {Codec::kNone, Codec::kLz4, Codec::kZstd}) {
    WriteBatch wb;
    wb.volume_id = 1;
    wb.codec = codec;
    Bytes text;
    for (int i = 0; i < 600; ++i) text.push_back(uint8_t("seq=1 flush ok "[i % 15]));
    wb.records.push_back({1, 4096, uint32_t(text.size()), RecordKind::kData, 5, text});
    wb.records.push_back({2, 0, 4096, RecordKind::kZero, 6, {}});
    wb.records.push_back({3, 8192, 512, RecordKind::kTrim, 7, {}});
    wb.records.push_back({4, 0, 0, RecordKind::kFlush, 8, {}});
    wb.records.push_back({5, 0, 0, RecordKind::kTag, 9, Bytes{'t', 'a', 'g'}});
    wb.records.push_back({6, 0, 0, RecordKind::kAnomaly, 10, EncodeAnomaly(2, "99% incompressible")});
    v.push_back(wb);
    WriteBatch sealed;
    sealed.volume_id = 2;
    sealed.codec = codec;
    sealed.records.push_back({1, 4096, 4096, RecordKind::kSealed, 5, Bytes(4096 + 16, 0x5a)});
    sealed.records.push_back({2, 0, 8192, RecordKind::kSealedZero, 6, Bytes(32, 0xa5)});
    v.push_back(sealed);
  }
  v.push_back(Ack{1, 5});
  v.push_back(Nack{1, NackReason::kGap, 6, "gap"});
  v.push_back(HashRequest{1, 2, 1u << 20, 0, 4, 3, 0});
  v.push_back(HashResponse{1, 2, 1u << 20, 0, {{1, 2}, {0, 0}, {3, 4}}, 5, HashStatus::kOk});
  v.push_back(HashResponse{1, 3, 65536, 0, {}, 2, HashStatus::kBehind});
  v.push_back(Heartbeat{1, 2});
  v.push_back(Stats{{{"bytes_in", 12.5}}});
  v.push_back(FailbackPlanRequest{4, "db1", 0});
  v.push_back(FailbackPlan{4, FailbackStatus::kOk, {{0, 2}, {10, 1}}, 4096});
  v.push_back(FailbackPlan{5, FailbackStatus::kNotFailingBack, {}, 0});
  v.push_back(PullRequest{6, "db1", {{0, 2}, {10, 1}}, {{1, 2}, {0, 0}, {3, 4}}});
  {
    PullResponse pr{6, FailbackStatus::kOk, Codec::kLz4, 1, {}};
    pr.records.push_back({1, 0, 4096, RecordKind::kData, 0, Bytes(4096, 'x')});
    pr.records.push_back({2, 40960, 4096, RecordKind::kZero, 0, {}});
    v.push_back(pr);
  }
  v.push_back(PullResponse{7, FailbackStatus::kNotFailingBack, Codec::kNone, 0, {}});
  v.push_back(GroupHold{8, 200, {"db1", "logs"}});
  v.push_back(GroupHold{9, 10'000, {"db1"}, true});
  v.push_back(GroupHeld{8, GroupHoldStatus::kRefused, "busy"});
  v.push_back(GroupRelease{8, "group.app.8.2"});
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  int n = 0;
  for (const Message& m : Samples()) {
    Result<Bytes> frame = EncodeMessage(m, 1);
    Result<Bytes> payload = EncodePayload(m);
    if (!frame.ok() || !payload.ok()) {
      std::fprintf(stderr, "encode failed: %s\n", frame.status().ToString().c_str());
      return 1;
    }
    Bytes typed{uint8_t(TypeOf(m))};
    typed.insert(typed.end(), payload->begin(), payload->end());
    if (!WriteFile(dir + "/frame-" + std::to_string(n), *frame) ||
        !WriteFile(dir + "/payload-" + std::to_string(n), typed)) {
      std::perror(dir.c_str());
      return 1;
    }
    ++n;
  }
  std::printf("wrote %d frames and %d payloads to %s\n", n, n, dir.c_str());
  return 0;
}
