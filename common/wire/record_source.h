// SPDX-License-Identifier: Apache-2.0
// RecordSource: what a replication stream ships. One volume's records, in
// sequence order, as the replication sender (common/wire/replication_sender.h)
// reads them; implemented by the agent's capture queue (agent/sender.h) and by
// the process server's spool (process-server/mt_link.h).
//
// The sender calls a source from its own threads, never while holding its
// lock, and never two calls for one source at the same time except Read (from
// the stream's worker) beside Acked/Resume (from the reader): a source must be
// thread-safe for that. A source may call ReplicationSender::Notify() from any
// thread, under its own locks (Notify takes only the sender's lock, and the
// sender never calls a source while holding it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/wire/protocol.h"

namespace cdp::repl {

// Why the sender tells a source where the peer stands.
enum class ResumeCause {
  kOpen,  // the VolumeOpenReply of a (re)connection
  kGap,   // a gap Nack: the peer holds everything below its expected sequence
};

class RecordSource {
 public:
  virtual ~RecordSource() = default;

  // The VolumeOpen sent for this stream on every connection.
  virtual proto::VolumeOpen OpenMessage() = 0;
  // How frames of this stream are compressed on the wire.
  virtual proto::Codec codec() const { return proto::Codec::kNone; }
  virtual int level() const { return 0; }
  // Frames of this stream in flight (sent, not yet acknowledged) at most;
  // 0: the sender's max_inflight. Asked once, at AddStream. (LoRS's
  // "threads": how much of one volume travels at once on a long link.)
  virtual int max_inflight() const { return 0; }

  // The peer durably holds every record <= `durable`. Returns the sequence
  // to send next: durable + 1, or the first sequence of a source that
  // renumbered its records to follow the peer. An error stalls the stream
  // (its message is the reason shown to the operator) until the next
  // connection.
  virtual Result<uint64_t> Resume(uint64_t durable, ResumeCause cause) = 0;

  // Appends the records with seq >= `from` to *out (empty: none yet): at most
  // `max_bytes` of record data (but at least one record) and `max_records`.
  // The first may have a higher sequence than `from` (records acknowledged or
  // renumbered meanwhile). An error stalls the stream.
  virtual Status Read(uint64_t from, uint64_t max_bytes, size_t max_records, std::vector<proto::Record>* out) = 0;

  // The peer acknowledged every record <= `durable` (strictly increasing).
  virtual void Acked(uint64_t durable) = 0;

  // Shipping stopped (`why` not ok: a refused open or batch, a failed read) or
  // resumed after a successful open (`why` ok). Default: nothing.
  virtual void Stalled(const Status& why) { (void)why; }

  // The peer refused the stream because the volume failed over at the master
  // target (proto::IsFailedOverNack; `message` is the peer's text, beginning
  // "failed over"): the stream is fenced. Stalled(why) follows; the fence
  // holds until the next Stalled(ok). Default: nothing.
  virtual void Fenced(const std::string& message) { (void)message; }

  // `batch` went out as a frame of `wire_bytes` bytes (header included).
  virtual void Shipped(const proto::WriteBatch& batch, uint64_t wire_bytes) {
    (void)batch;
    (void)wire_bytes;
  }
  // `frames` sent frames were given up and will be sent again (gap, busy,
  // failed batch, reconnection).
  virtual void Rewound(uint64_t frames) { (void)frames; }
};

}  // namespace cdp::repl
