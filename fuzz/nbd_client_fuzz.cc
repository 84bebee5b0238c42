// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the NBD client (common/nbd/nbd_client.h) against a
// hostile server: what `cdpctl serve` reads from the master target's export
// port at the tenant's site, and what cdp-loadgen reads from a tap. The
// server's bytes are the input; no socket (an in-memory ByteStream,
// fuzz/mem_stream.h).
//
// Input: a flags byte, four op bytes, then the server's bytes (greeting,
// option replies, simple replies, READ data), served in chunks.
//   flags bits 0-1  read chunk: whole, 1, 7 or 64 bytes per ReadSome
//   flags bits 2-3  max_inflight: 1, 2, 4 or 16
//   op byte         low 3 bits: Write, WriteZeroes, Read, Drain, Flush, Close,
//                   Write with FUA, Read of max_block(); the rest picks the
//                   offset (in 4 KiB blocks, may fall past the end)
//
// Properties: no crash, leak or sanitizer report, and no allocation the
// server sizes beyond 64 KiB (option replies are capped; reads are sized by
// the caller); what the client sends always parses with the server's own
// parsers: its flags, one NBD_OPT_GO for "db" asking for the block size, and
// requests within the export's size and max_block() with handles never
// reused while outstanding; every status text is printable ASCII (a server's
// error text cannot put escape sequences on the operator's terminal); after
// a failure from the wire (kCorruption, kIOError, kUnavailable, kBusy) every
// later call fails.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/nbd/nbd_client.h"
#include "common/nbd/nbd_proto.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/mem_stream.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;
using cdp::fuzz::MemStream;
using cdp::fuzz::Wire;

constexpr size_t kOps = 4;

bool Printable(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c >= 0x7f) return false;
  }
  return true;
}

bool FromWire(const Status& s) {
  return s.code() == Code::kCorruption || s.code() == Code::kIOError || s.code() == Code::kUnavailable ||
         s.code() == Code::kBusy;
}

// What the client wrote: flags, then one GO for "db" with {BLOCK_SIZE}; then
// the requests (each within the export) from `*after_go` on.
void CheckHandshakeBytes(ByteSpan w, size_t* after_go) {
  uint32_t flags = 0;
  Check(nbd::ParseClientFlags(w, true, &flags) == nbd::ParseResult::kComplete);
  w = w.subspan(nbd::kClientFlagsSize);
  nbd::OptionHeader h;
  Check(nbd::ParseOptionHeader(w, &h) == nbd::ParseResult::kComplete);
  Check(h.option == nbd::kOptGo);
  w = w.subspan(nbd::kOptionHeaderSize);
  Check(w.size() >= h.length);
  nbd::InfoRequest ir;
  Check(nbd::ParseInfoRequest(w.first(h.length), &ir).ok());
  Check(ir.name == "db");
  Check(ir.infos == std::vector<uint16_t>{nbd::kInfoBlockSize});
  *after_go = nbd::kClientFlagsSize + nbd::kOptionHeaderSize + h.length;
}

void CheckRequests(ByteSpan w, const NbdClient& c) {
  std::set<uint64_t> handles;
  while (!w.empty()) {
    nbd::Request r;
    Check(nbd::ParseRequest(w, &r) == nbd::ParseResult::kComplete);
    w = w.subspan(nbd::kRequestHeaderSize);
    Check(handles.insert(r.handle).second);  // handles only grow: never reused
    if (r.type == nbd::kCmdDisc || r.type == nbd::kCmdFlush) {
      Check(r.offset == 0 && r.length == 0);
      continue;
    }
    Check(r.type == nbd::kCmdWrite || r.type == nbd::kCmdRead || r.type == nbd::kCmdWriteZeroes);
    Check(r.length >= 1 && r.length <= c.max_block());
    Check(r.offset <= c.size() && r.length <= c.size() - r.offset);
    if (r.type == nbd::kCmdWrite) {
      Check(w.size() >= r.length);
      w = w.subspan(r.length);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 + kOps) return 0;
  static const size_t kChunks[] = {0, 1, 7, 64};
  static const uint32_t kInflight[] = {1, 2, 4, 16};
  const uint8_t flags = data[0];
  const uint8_t* ops = data + 1;
  Wire wire;
  wire.script.assign(data + 1 + kOps, data + size);
  wire.chunk = kChunks[flags & 3];
  NbdClientOptions o;
  o.max_inflight = kInflight[(flags >> 2) & 3];
  o.timeout_ms = 1000;
  NbdUri uri;
  uri.export_name = "db";

  auto c = NbdClient::ConnectOver(std::make_unique<MemStream>(&wire, nullptr), uri, o);
  if (!c.ok()) {
    Check(Printable(c.status().ToString()));
    return 0;
  }
  NbdClient& client = **c;
  size_t after_go = 0;
  CheckHandshakeBytes(wire.written, &after_go);

  Status broken;  // the first failure from the wire
  Bytes buf;
  const Bytes payload(8192, 0x5a);
  for (size_t i = 0; i < kOps; ++i) {
    const uint64_t offset = uint64_t(ops[i] >> 3) * 4096;
    Status s;
    switch (ops[i] & 7) {
      case 0: s = client.Write(offset, ByteSpan(payload.data(), 4096)); break;
      case 1: s = client.WriteZeroes(offset, 8192, false, true); break;
      case 2:
        buf.resize(4096);
        s = client.Read(offset, 4096, buf.data());
        break;
      case 3: s = client.Drain(); break;
      case 4: s = client.Flush(); break;
      case 5: s = client.Close(); break;
      case 6: s = client.Write(offset, ByteSpan(payload.data(), payload.size()), true); break;
      case 7: {
        // The largest request the server allows, capped for the fuzzer's memory.
        const uint32_t len = std::min<uint32_t>(client.max_block(), 64 << 10);
        buf.resize(len);
        s = client.Read(offset, len, buf.data());
        break;
      }
    }
    Check(Printable(s.ToString()));
    if (!broken.ok()) Check(!s.ok());
    if (broken.ok() && FromWire(s)) broken = s;
  }
  CheckRequests(ByteSpan(wire.written).subspan(after_go), client);
  return 0;
}
