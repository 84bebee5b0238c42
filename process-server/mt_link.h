// MtLink: one TCP connection (kept alive, reconnected) from the process server
// to the master target for one tenant, shipping the spools of the volumes
// assigned to it.
//
//   +-------------+  Connect + ClientHandshake ok   +------------------------+
//   | Disconnected| ------------------------------> | Connected: VolumeOpen  |
//   +-------------+                                 | for every volume       |
//        ^   ^ sleep backoff*jitter(0.5..1.5),      +-----------+------------+
//        |   | backoff = min(2*backoff, max)                    | VolumeOpenReply{durable}
//        |   +---- connect/handshake failed                     v   next = durable + 1
//        |                                          +------------------------+
//        +--- channel broken, ack timeout,  <------ | Shipping: per volume up |
//             Stop()                                | to max_inflight frames  |
//                                                   +------------------------+
// Shipping, per volume: read durable records from the spool at `next`, up to
// frame_bytes, send them as one WriteBatch (compressed with the volume's codec
// by FrameChannel::Send), charge the frame's wire bytes to the shared throttle
// and sleep as long as it says. Ack{durable} from the MT releases spool
// segments up to durable. Nack{kGap, expected}: the MT has everything below
// `expected`: rewind `next` to it (late gap nacks for frames sent before the
// rewind are ignored). Nack{kBusy} / Nack{kInternal}: rewind to acked+1 and
// hold the volume for 0.2 s / 1 s. Nack{kUnknownVolume}: reconnect (reopens
// every volume). Any other nack (bad record, wrong generation, permission)
// stalls the volume: it is reported in /v1/volumes and kept in the spool.
// On reconnect every volume is reopened and shipping resumes from the MT's
// durable sequence, so nothing is skipped and duplicates are skipped by the MT.
//
// Thread safety: all public methods are thread-safe. Owns the connect/send
// thread and, while connected, a reader and workers-1 more sender threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "common/channel.h"
#include "common/clock.h"
#include "common/protocol.h"
#include "common/result.h"
#include "common/throttle.h"
#include "process-server/volume.h"

namespace cdp::ps {

struct MtLinkOptions {
  Clock* clock = nullptr;        // must outlive the link
  Throttle* throttle = nullptr;  // shared by all links; may be null (unlimited)
  std::string host;
  uint16_t port = 0;
  std::string tenant;
  std::string secret;
  std::string client_id = "process-server";
  int index = 0;                 // which of the tenant's connections (for logs)
  uint64_t frame_bytes = 1u << 20;
  int max_inflight = 8;
  // Compression/sending threads of this link (the compression pool): volumes
  // are spread over them round-robin; one volume is always shipped by one
  // thread, so its frames stay in order.
  int workers = 1;
  uint64_t backoff_min_ms = 100;
  uint64_t backoff_max_ms = 30'000;
  uint64_t ack_timeout_ms = 120'000;
  uint64_t heartbeat_ms = 10'000;
};

class MtLink {
 public:
  explicit MtLink(MtLinkOptions options);
  ~MtLink();  // Stop()s
  MtLink(const MtLink&) = delete;
  MtLink& operator=(const MtLink&) = delete;

  void Start();
  // Closes the connection and joins the threads. Idempotent.
  void Stop();

  // Ships `v` from now on (opened at the MT on the current or next connection).
  // `v` must outlive the link.
  void AddVolume(Volume* v);

  // Waits at most `timeout` until the MT answered the VolumeOpen of `v` on the
  // current connection. Success: the MT's durable sequence. kUnavailable when
  // not connected in time; the MT's refusal as kPermissionDenied/kInvalidArgument.
  Result<uint64_t> WaitOpened(Volume* v, std::chrono::milliseconds timeout);

  // Forwards a hash request for `v` and waits for the answer (request_id and
  // volume_id of the answer are the MT's; the caller substitutes its own).
  Result<proto::HashResponse> Hash(Volume* v, const proto::HashRequest& req, std::chrono::milliseconds timeout);

  // New durable data may be waiting.
  void Notify();

  bool connected() const { return connected_.load(); }
  uint64_t connects() const { return connects_.load(); }
  std::string state() const;

 private:
  struct LinkVolume {
    Volume* vol = nullptr;
    int worker = 0;           // the pool thread that ships it
    bool open_sent = false;
    bool opened = false;
    Status open_error;
    uint32_t mt_id = 0;
    uint64_t mt_open_durable = 0;
    uint64_t next = 1;        // next sequence to send
    uint64_t acked = 0;       // MT durable
    uint64_t rewind_to = 0;   // last gap rewind target (late nacks for it ignored)
    uint64_t rewinds = 0;
    std::deque<uint64_t> inflight;  // last sequence of each unacknowledged frame
    uint64_t last_progress_us = 0;
    uint64_t hold_until_us = 0;
  };
  struct PendingHash {
    bool done = false;
    Status status;
    proto::HashResponse response;
  };

  void Run();
  Status SendLoop(const std::shared_ptr<FrameChannel>& ch, uint64_t epoch, int worker);
  void ReadLoop(std::shared_ptr<FrameChannel> ch, uint64_t epoch);
  void HandleMessage(FrameChannel& ch, proto::Message& m);
  void Rewind(LinkVolume& lv, uint64_t to);  // mu_ held
  void SleepMs(uint64_t ms);                   // interruptible by Stop()

  MtLinkOptions opt_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> connected_{false};
  std::atomic<uint64_t> connects_{0};
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;         // sender wake-ups, open and hash waiters
  std::map<Volume*, std::unique_ptr<LinkVolume>> volumes_;
  std::map<uint32_t, LinkVolume*> by_mt_id_;
  std::deque<LinkVolume*> open_fifo_;  // VolumeOpens awaiting their reply, in order
  std::shared_ptr<FrameChannel> channel_;
  uint64_t epoch_ = 0;                 // bumped per connection
  bool conn_failed_ = false;
  std::string last_error_;
  uint64_t next_request_id_ = 1;
  std::map<uint64_t, PendingHash*> hashes_;
  std::mt19937_64 rng_;
};

}  // namespace cdp::ps
