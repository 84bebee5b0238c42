// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the wire protocol (see fuzz/README.md).
//
// Three properties, on every input:
//  1. DecodeFrame over the input as a byte stream never crashes, never reads
//     out of bounds, and on kComplete consumes 24..len bytes; each complete
//     frame goes through ParseMessage.
//  2. The CRC would stop almost every mutated frame before the parsers, so the
//     input is also handed to ParseMessage directly: byte 0 picks the type,
//     the rest is the payload.
//  3. Whatever parses re-encodes, and the re-encoded frame decodes and parses
//     to the same canonical bytes (no message changes on a round trip).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <variant>

#include "common/wire/protocol.h"

namespace {

using namespace cdp;
using namespace cdp::proto;

Bytes Canonical(Message m) {
  if (auto* wb = std::get_if<WriteBatch>(&m)) wb->codec = Codec::kNone;
  Result<Bytes> p = EncodePayload(m);
  if (!p.ok()) abort();  // a parsed message must always re-encode
  return *p;
}

void CheckRoundTrip(const Message& m) {
  Result<Bytes> f = EncodeMessage(m, 7);
  if (!f.ok()) abort();
  Frame fr;
  DecodeOutcome o = DecodeFrame(*f, &fr);
  if (o.state != DecodeState::kComplete || o.consumed != f->size() || fr.sequence != 7) abort();
  Result<Message> back = ParseMessage(fr);
  if (!back.ok()) abort();
  if (Canonical(*back) != Canonical(m)) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteSpan input(data, size);

  // 1. As a stream of frames.
  size_t pos = 0;
  while (pos < input.size()) {
    Frame fr;
    DecodeOutcome o = DecodeFrame(input.subspan(pos), &fr, 1u << 20);
    if (o.state != DecodeState::kComplete) break;
    if (o.consumed < kHeaderSize || o.consumed > input.size() - pos) abort();
    pos += o.consumed;
    Result<Message> m = ParseMessage(fr);
    if (m.ok()) CheckRoundTrip(*m);
  }

  // 2. As a type byte and a payload, past the CRC.
  if (size >= 1) {
    Frame fr;
    fr.type = MsgType(data[0] % 14);  // includes the invalid type 0
    fr.payload = ByteSpan(data + 1, size - 1);
    Result<Message> m = ParseMessage(fr);
    // 3. Round trip of whatever parsed.
    if (m.ok()) CheckRoundTrip(*m);
  }
  return 0;
}
