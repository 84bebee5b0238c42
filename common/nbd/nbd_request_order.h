// SPDX-License-Identifier: Apache-2.0
// The order of one NBD connection's requests (nbd_server.h, "Request
// pipeline"), as a state machine without I/O: where each request runs, which
// ones wait, and when a DISC may close. The connection (nbd_connection.cc)
// asks it on the socket's strand and does what it answers.
//
//   - READ and BLOCK_STATUS change nothing, so they may run together. A READ
//     goes to the read pool when nothing of the connection is on the device
//     strand and it is larger than kInlineMaxBytes or more requests are
//     queued behind it (pool READs in flight, or bytes buffered after it):
//     several READs of one connection are then at the device at once.
//   - Anything else (WRITE, WRITE_ZEROES, TRIM, FLUSH, a refused request)
//     is held until every pool READ before it is done, and every request
//     behind a held one is held too: a WRITE never overtakes a READ it
//     follows, nor a READ a WRITE.
//   - A READ or WRITE of at most kInlineMaxBytes and a BLOCK_STATUS run on
//     the socket's strand when nothing of the connection is on the device
//     strand: no hand-off to another thread and back, which is most of the
//     cost of a small read. Anything else goes to the device strand, which
//     runs one request at a time, in order, while the socket's strand reads
//     the next ones.
//
// Thread safety: none; one connection's socket strand.
#pragma once

#include <cstdint>
#include <deque>

#include "common/base/coding.h"
#include "common/nbd/nbd_proto.h"

namespace cdp::nbd_detail {

// A READ or WRITE up to this size runs on the socket's strand:
// docs/benchmarks.md, "Export reads without a hand-off".
constexpr uint64_t kInlineMaxBytes = 256u << 10;

// A request on its way to the device, with its in-flight charge.
struct PendingRequest {
  nbd::Request r;
  Bytes payload;
  uint32_t err = 0;  // != 0: refused with this errno (nbd::CheckRequest), not run
  uint64_t charge = 0;
};

class RequestOrder {
 public:
  enum class Where {
    kHeld,          // kept here until the pool READs before it are done
    kReadPool,      // the caller runs it on the read pool, then PoolReadDone()
    kHere,          // the caller runs it now, on the socket's strand
    kDeviceStrand,  // the caller runs it on the device strand, then DeviceDone()
  };
  // Where *p runs. On kHeld the order has taken *p (PoolReadDone gives it
  // back). `read_pool`: the server has one; `more_buffered`: bytes after this
  // request are buffered.
  Where Dispatch(PendingRequest* p, bool read_pool, bool more_buffered);

  // A request's reply from the device strand is queued.
  void DeviceDone();
  // A pool READ's reply is queued. When it was the last pool READ, returns
  // the held requests, in order, to be dispatched again (one may be held
  // again behind a READ it follows); else nothing.
  std::deque<PendingRequest> PoolReadDone();

  enum class Disc {
    kWait,                // a pool READ or a held request is before it: ask DiscReady()
    kBehindDeviceStrand,  // ask again once the device strand ran what it holds
    kClose,               // every request before it has queued its reply
  };
  // The client sent NBD_CMD_DISC (nothing is dispatched after it).
  Disc OnDisc();
  // True once, when a DISC answered kWait and nothing is held or on the pool
  // any more (after PoolReadDone's requests were dispatched again): then
  // OnDisc() again.
  bool DiscReady();

  uint64_t reads_in_pool() const { return reads_in_pool_; }
  uint64_t on_device_strand() const { return on_device_strand_; }
  size_t held() const { return held_.size(); }

 private:
  uint64_t on_device_strand_ = 0;  // dispatched there, reply not queued yet
  uint64_t reads_in_pool_ = 0;     // dispatched there, reply not queued yet
  std::deque<PendingRequest> held_;
  bool disc_waiting_ = false;
};

}  // namespace cdp::nbd_detail
