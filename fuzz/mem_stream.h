// SPDX-License-Identifier: Apache-2.0
// An in-memory ByteStream for the fuzz targets that drive a protocol endpoint
// (fuzz/frame_handshake_fuzz.cc, fuzz/nbd_client_fuzz.cc): reads serve a
// script in chunks (then EOF, kUnavailable), writes are kept. Not part of any
// daemon.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/net/byte_stream.h"

namespace cdp::fuzz {

// What the stream reads and what was written to it; outlives the stream.
struct Wire {
  Bytes script;
  size_t pos = 0;
  size_t chunk = 0;                    // 0: all that fits
  std::function<std::optional<Bytes>()> refill;  // once, when the script ends
  Bytes written;
  bool shut = false;
};

class MemStream final : public ByteStream {
 public:
  MemStream(Wire* wire, const TlsPeer* tls) : wire_(wire), tls_(tls) {}
  Result<size_t> ReadSome(std::span<uint8_t> buf, Deadline) override {
    if (wire_->shut) return Status::Aborted("fuzz: stream shut down");
    if (wire_->pos == wire_->script.size() && wire_->refill) {
      auto refill = std::move(wire_->refill);
      wire_->refill = nullptr;
      if (std::optional<Bytes> more = refill()) {
        wire_->script = std::move(*more);
        wire_->pos = 0;
      }
    }
    size_t n = std::min(buf.size(), wire_->script.size() - wire_->pos);
    if (wire_->chunk > 0) n = std::min(n, wire_->chunk);
    if (n == 0) return Status::Unavailable("fuzz: end of input");
    std::copy_n(wire_->script.begin() + long(wire_->pos), n, buf.begin());
    wire_->pos += n;
    return n;
  }
  Status WriteAll(std::span<const ByteSpan> bufs, Deadline) override {
    if (wire_->shut) return Status::Aborted("fuzz: stream shut down");
    for (ByteSpan b : bufs) wire_->written.insert(wire_->written.end(), b.begin(), b.end());
    return Status::OK();
  }
  void Shutdown() override { wire_->shut = true; }
  const std::string& peer() const override { return peer_; }
  const TlsPeer* tls_peer() const override { return tls_; }

 private:
  Wire* const wire_;
  const TlsPeer* const tls_;
  const std::string peer_ = "fuzz:peer";
};

}  // namespace cdp::fuzz
