// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the frame channel's handshake (common/wire/channel.h):
// ServerHandshake, what the process server and the master target run on every
// connection before anything is authenticated, and ClientHandshake, what an
// agent or a process server runs against a server that may be hostile.
//
// No socket: the FrameChannel is adopted over an in-memory ByteStream that
// serves the input in chunks and keeps what the channel writes. EOF when the
// script ends. A TLS layer is simulated by the stream's tls_peer().
//
// Input: a flags byte, then one or two parts joined by fuzz::kFileSeparator.
//   bits 0-1  read chunk: whole, 1, 7 or 64 bytes per ReadSome
//   bit 2     a TLS peer (tenant "acme", name "host1"), bits 3-4 its role:
//             agent, ps, mt, "bogus"
//   bit 5     smart peer: the harness answers the other side's nonce with the
//             right proof (server side: an Auth frame put before part 2;
//             client side: a Challenge made from the first 32 bytes of
//             part 1 put before the rest of part 1)
//   bit 6     client side (else server side)
//   bit 7     server side: the secret lookup answers "" (else the secret for
//             "acme" and nothing for other tenants); client side: role ps
//             (else agent)
// Server side: part 1 is what the server reads before it sends its
// Challenge, part 2 what it reads after. Client side: part 1 is what the
// client reads after its Hello.
//
// Properties: no crash, leak or sanitizer report; the server answers a Hello
// with one Challenge and, after an Auth, one AuthResult whose refusal says
// only "authentication failed"; it accepts exactly when the peer proved the
// secret of a known tenant whose TLS certificate (if any) matches the Hello:
// a smart peer with a clean Hello is always accepted, anyone else never. The
// client never sends a real proof to a server that has not proven itself (its
// Auth is then all zeros), sends nothing to a certificate of the wrong role,
// and succeeds only against a smart server that accepts.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/base/log.h"
#include "common/crypto/auth.h"
#include "common/net/byte_stream.h"
#include "common/wire/channel.h"
#include "common/wire/protocol.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/mem_stream.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;
using cdp::fuzz::MemStream;
using cdp::fuzz::Wire;

constexpr char kSecret[] = "s3cret-of-acme-0123456789";
constexpr char kTenant[] = "acme";
constexpr std::chrono::milliseconds kTimeout{5000};

// The complete frames of `b` (whatever follows the last one is ignored).
std::vector<proto::Message> Frames(ByteSpan b, std::vector<uint64_t>* seqs = nullptr) {
  std::vector<proto::Message> out;
  for (;;) {
    proto::Frame f;
    proto::DecodeOutcome o = proto::DecodeFrame(b, &f);
    if (o.state != proto::DecodeState::kComplete) break;
    Result<proto::Message> m = proto::ParseMessage(f);
    Check(m.ok());  // we only look at what the channel itself wrote, or checked
    out.push_back(std::move(*m));
    if (seqs != nullptr) seqs->push_back(f.sequence);
    b = b.subspan(o.consumed);
  }
  return out;
}

// `b` is exactly one Hello frame of sequence 1.
std::optional<proto::Hello> CleanHello(ByteSpan b) {
  proto::Frame f;
  proto::DecodeOutcome o = proto::DecodeFrame(b, &f, proto::kHandshakeMaxPayload);
  if (o.state != proto::DecodeState::kComplete || o.consumed != b.size() || f.sequence != 1) return std::nullopt;
  Result<proto::Message> m = proto::ParseMessage(f);
  if (!m.ok() || !std::holds_alternative<proto::Hello>(*m)) return std::nullopt;
  return std::get<proto::Hello>(*m);
}

Bytes Frame(const proto::Message& m, uint64_t seq) {
  Result<Bytes> b = proto::EncodeMessage(m, seq);
  Check(b.ok());
  return *b;
}

std::span<const uint8_t> Binding(const TlsPeer* tls) {
  return tls == nullptr ? std::span<const uint8_t>() : std::span<const uint8_t>(tls->binding);
}

void Server(uint8_t flags, const std::vector<ByteSpan>& parts, const TlsPeer* tls, Wire* wire) {
  const bool smart = (flags & 0x20) != 0;
  const bool empty_secret = (flags & 0x80) != 0;
  wire->script.assign(parts[0].begin(), parts[0].end());
  const Bytes after = parts.size() > 1 ? Bytes(parts[1].begin(), parts[1].end()) : Bytes();
  const std::optional<proto::Hello> clean = CleanHello(parts[0]);
  wire->refill = [&]() -> std::optional<Bytes> {
    std::vector<proto::Message> out = Frames(wire->written);
    if (out.empty()) return std::nullopt;  // no Challenge yet: the peer is gone
    Bytes next;
    if (smart && clean) {
      const auto& ch = std::get<proto::Challenge>(out[0]);
      Result<auth::Proof> proof =
          auth::ClientProof(kSecret, ch.server_nonce, clean->client_nonce, clean->tenant, Binding(tls));
      Check(proof.ok());
      next = Frame(proto::Auth{*proof}, 2);
    }
    next.insert(next.end(), after.begin(), after.end());
    return next;
  };

  auto channel = FrameChannel::Adopt(std::make_unique<MemStream>(wire, tls));
  Check(channel.ok());
  PeerIdentity peer;
  Result<std::string> tenant = ServerHandshake(
      **channel,
      [&](const std::string& t) -> std::optional<std::string> {
        if (empty_secret) return std::string();
        if (t == kTenant) return std::string(kSecret);
        return std::nullopt;
      },
      kTimeout, &peer);

  // What the server wrote: a Challenge, then at most one AuthResult.
  std::vector<uint64_t> seqs;
  std::vector<proto::Message> out = Frames(wire->written, &seqs);
  Check(out.size() <= 2);
  for (size_t i = 0; i < out.size(); ++i) Check(seqs[i] == i + 1);
  if (!out.empty()) Check(std::holds_alternative<proto::Challenge>(out[0]));
  std::optional<proto::AuthResult> result;
  if (out.size() == 2) {
    Check(std::holds_alternative<proto::AuthResult>(out[1]));
    result = std::get<proto::AuthResult>(out[1]);
    if (!result->accepted) Check(result->reason == "authentication failed");
  }

  // Who must be accepted: a smart peer, a clean Hello, a known tenant and, over
  // TLS, a certificate of role agent or ps whose role and tenant are the Hello's.
  bool known = clean && !empty_secret && clean->tenant == kTenant;
  if (known && tls != nullptr) {
    const bool agent = tls->role == "agent", ps = tls->role == "ps";
    known = (agent || ps) && clean->role == (agent ? proto::Role::kAgent : proto::Role::kProcessServer) &&
            tls->tenant == clean->tenant;
  }
  if (tenant.ok()) {
    Check(smart && known && *tenant == clean->tenant && result && result->accepted);
    Check(peer.tenant == *tenant && peer.client_id == clean->client_id && peer.tls == (tls != nullptr));
    Check(peer.cert_name == (tls != nullptr ? tls->name : std::string()));
  } else {
    Check(!(result && result->accepted));
    if (result) Check(tenant.status().code() == Code::kPermissionDenied);
    // A smart peer with a clean Hello of a known tenant is refused only when
    // its own bytes (part 2) broke the stream before the Auth was read; the
    // Auth comes first, so that cannot happen.
    Check(!(smart && known));
  }
  Check((*channel)->broken() == !tenant.ok());
}

void Client(uint8_t flags, const std::vector<ByteSpan>& parts, const TlsPeer* tls, Wire* wire) {
  const bool smart = (flags & 0x20) != 0;
  const proto::Role role = (flags & 0x80) != 0 ? proto::Role::kProcessServer : proto::Role::kAgent;
  const Bytes in(parts[0].begin(), parts[0].end());
  wire->refill = [&]() -> std::optional<Bytes> {
    if (!smart) return in;
    std::vector<proto::Message> out = Frames(wire->written);
    Check(out.size() == 1 && std::holds_alternative<proto::Hello>(out[0]));
    const auto& hello = std::get<proto::Hello>(out[0]);
    proto::Challenge ch;
    const size_t n = std::min(in.size(), ch.server_nonce.size());
    std::copy_n(in.begin(), n, ch.server_nonce.begin());
    Result<auth::Proof> proof = auth::ServerProof(kSecret, hello.client_nonce, ch.server_nonce, hello.tenant, Binding(tls));
    Check(proof.ok());
    ch.server_proof = *proof;
    Bytes next = Frame(ch, 1);
    next.insert(next.end(), in.begin() + long(n), in.end());
    return next;
  };

  auto channel = FrameChannel::Adopt(std::make_unique<MemStream>(wire, tls));
  Check(channel.ok());
  Status s = ClientHandshake(**channel, role, kTenant, "host1", kSecret, kTimeout);

  bool fits = true;
  if (tls != nullptr) {
    fits = role == proto::Role::kAgent ? (tls->role == "ps" || tls->role == "mt") : tls->role == "mt";
  }
  std::vector<uint64_t> seqs;
  std::vector<proto::Message> out = Frames(wire->written, &seqs);
  if (!fits) {
    Check(out.empty() && s.code() == Code::kPermissionDenied);
    return;
  }
  Check(!out.empty() && out.size() <= 2 && std::holds_alternative<proto::Hello>(out[0]));
  for (size_t i = 0; i < out.size(); ++i) Check(seqs[i] == i + 1);
  if (out.size() == 2) {
    Check(std::holds_alternative<proto::Auth>(out[1]));
    const auto& proof = std::get<proto::Auth>(out[1]).client_proof;
    // Only a server that proved the secret (the smart one) gets a real proof.
    if (!smart) Check(std::all_of(proof.begin(), proof.end(), [](uint8_t b) { return b == 0; }));
  }
  if (s.ok()) Check(smart && out.size() == 2);
  Check((*channel)->broken() == !s.ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    log::Options lo;
    lo.level = "off";
    return log::Init(lo).ok();
  }();
  (void)quiet;
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  std::vector<ByteSpan> parts = fuzz::SplitFiles(ByteSpan(data + 1, size - 1), 2);

  TlsPeer tls;
  static const char* const kRoles[] = {"agent", "ps", "mt", "bogus"};
  tls.role = kRoles[(flags >> 3) & 3];
  tls.tenant = tls.role == "mt" ? "" : kTenant;
  tls.name = "host1";
  tls.binding.fill(0x42);
  const TlsPeer* tls_peer = (flags & 0x04) != 0 ? &tls : nullptr;

  Wire wire;
  static const size_t kChunks[] = {0, 1, 7, 64};
  wire.chunk = kChunks[flags & 3];
  if ((flags & 0x40) != 0) {
    Client(flags, parts, tls_peer, &wire);
  } else {
    Server(flags, parts, tls_peer, &wire);
  }
  return 0;
}
