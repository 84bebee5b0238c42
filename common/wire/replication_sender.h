// SPDX-License-Identifier: Apache-2.0
// ReplicationSender: the one replication sender. It ships the records of one
// or more streams (volumes), each read from a RecordSource
// (common/wire/record_source.h), to one peer over one connection, kept alive and
// reconnected. The agent ships its volume to the process server with it
// (agent/sender.h), the process server a tenant's spools to the master target
// (process-server/mt_link.h).
//
//   +--------------+  Connect (through opts.wrap) + ClientHandshake(role)
//   | disconnected | -----------------------------------------------+
//   +--------------+                                                  v
//      ^  wait backoff * jitter(0.5..1.5),         +---------------------------------+
//      |  backoff = min(2 * backoff, max);         | connected: VolumeOpen for every |
//      |  reset by a successful handshake          | stream, in order (answers FIFO) |
//      |                                           +----------------+----------------+
//      |                                                            | VolumeOpenReply{durable}:
//      |                                                            v next = source.Resume(durable)
//      |   channel error, nothing received for     +---------------------------------+
//      +-- dead_peer_ms, Nack{kUnknownVolume},  <- | streaming, per stream:          |
//          every stream stalled, Stop()            |  Read(next) -> WriteBatch while |
//                                                  |  < max_inflight unacknowledged  |
//                                                  +---------------------------------+
//   per stream, from the peer:
//     Ack{d}            source.Acked(d); frames <= d leave the window. An Ack
//                       (or a gap's E-1) beyond the highest sequence ever sent
//                       or told by the open is a protocol error: the session
//                       ends and nothing is released
//     Nack{kGap, E}     the peer holds everything below E: next = source.Resume(E-1)
//                       (repeats of the same E, for frames sent before, are ignored)
//     Nack{kBusy}       next = acked + 1, hold the stream busy_hold_ms
//     Nack{kInternal}   answers the oldest pending Hash of the stream if there is
//                       one (it fails, the stream goes on); else the batch failed
//                       at the peer: next = acked + 1, hold internal_hold_ms
//     any other Nack    the stream stalls (source.Stalled) until the next connection;
//                       a "failed over" one (proto::IsFailedOverNack, for an
//                       open too) first tells source.Fenced
//   a Nack for handle 0 (or an unknown one) while opens are pending refuses the
//   oldest open: that stream stalls.
//   Heartbeat after heartbeat_ms without sending; the peer echoes it.
//   GroupHold, GroupRelease   given to opts.on_peer_request (none: a protocol error)
//   "every stream stalled" does not count streams whose open this connection
//   refused as failed over: the peer closes the session itself when that
//   fence lifts (master-target/ps_session.cc), and a fenced volume's link
//   stays up for its failback calls.
//
// Calls (request/response on the current connection, answered by request_id;
// the reader completes them):
//   Hash / HashAsync  HashRequest of an open stream -> HashResponse
//   CallAsync         FailbackPlanRequest -> FailbackPlan, PullRequest ->
//                     PullResponse (they name their volume: no stream needed)
//   A call fails (exactly once) when it cannot be sent, when the connection
//   drops or the sender stops; a Hash also on the stream's Nack{kInternal}.
//   An answer of the wrong type for its request_id is a protocol error.
//   While a call is pending or one was made in the last call_hold_ms, a
//   session whose every stream is stalled is kept (not ended to retry the
//   opens, so that the calls are not cut off); it ends once the calls have
//   been quiet that long.
//
// RemoveStream takes a stream out for good (its spool was retired): its open
// is no longer sent, its records no longer read, answers for its handle are
// ignored and its pending hash calls fail.
//
// Frames: up to frame_bytes of record data and frame_records records; when
// the batch is small and frames are in flight the worker waits linger_ms once
// for it to grow. Streams are spread over `workers` sending threads (the
// compression pool: FrameChannel::Send compresses in the caller); one stream
// is always sent by one thread, so its frames stay in order. Duplicates after
// a rewind or reconnection are skipped by the peer; nothing is ever skipped
// here: the peer's durable sequence is where every (re)start begins.
//
// Thread safety: every public method is thread-safe. Owns the connect thread
// (worker 0), and while connected a reader and workers-1 sending threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/result.h"
#include "common/wire/channel.h"
#include "common/wire/protocol.h"
#include "common/wire/record_source.h"

namespace cdp::repl {

class ReplicationSender;

// A link to a peer: where it is, who we are, how records are cut into frames,
// the window, and how the link recovers. One struct, embedded whole in the
// agent's SenderOptions (agent -> PS, agent/sender.h) and in the PS's
// ProcessServerOptions and MtLinkOptions (PS -> MT); each daemon's config
// fills it and passes it down, nobody mirrors its fields.
struct LinkOptions {
  HostPort peer{"127.0.0.1", 0};
  std::string tenant;
  std::string secret;
  std::string client_id;
  uint64_t frame_bytes = 1u << 20;  // record data per WriteBatch (at least one record)
  size_t frame_records = 16384;
  uint32_t linger_ms = 0;           // wait once this long for a small frame to grow
  int max_inflight = 8;             // frames per stream sent, not yet acknowledged (RecordSource::max_inflight overrides)
  int workers = 1;                  // sending threads (the compression pool)
  uint64_t connect_timeout_ms = 5000;  // connect, and the handshake
  // Reconnect back-off: doubles from min to max, jittered by 0.5..1.5 and
  // never longer than max, so a returning peer is back within max (+ the
  // connect) however long it was gone (issue 38 F6: 30 s had kept a returned
  // MT idle for most of its catch-up).
  uint64_t backoff_min_ms = 100;
  uint64_t backoff_max_ms = 2'000;
  uint64_t busy_hold_ms = 200;      // hold a stream after a busy nack (the peer over quota)
  uint64_t internal_hold_ms = 1000;  // ... after an internal-error nack
  uint64_t heartbeat_ms = 10'000;   // a Heartbeat when nothing was sent for this long
  uint64_t dead_peer_ms = 30'000;   // nothing received for this long: reconnect
  // A session whose every stream is stalled is kept this long after the last
  // call (see "Calls" above) instead of being ended at once.
  uint64_t call_hold_ms = 10'000;
};

// The wire bytes of one call (CallAsync): its request's frame and its
// answer's, header included (compressed, as they crossed the network).
struct CallBytes {
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> received{0};
};

struct SenderOptions {
  LinkOptions link;
  const Clock* clock = nullptr;  // must outlive the sender; null = the system clock
  std::string log_name = "repl";  // logger name
  std::string peer_name = "peer";  // in messages: "process server", "master target"
  std::string label;               // in log lines: which link ("tenant=acme link=0")
  StreamWrapper wrap;              // filters over the transport (the throttle, TLS); may be empty
  proto::Role role = proto::Role::kAgent;
  // The peer's own requests on this connection (GroupHold, GroupRelease: the
  // process server coordinating a group point, docs/groups.md). Called on the
  // reader's thread without the sender's lock held, in the order received;
  // it must not block (an answer goes out through Send from another thread).
  // Empty: such a message is a protocol error that ends the session.
  std::function<void(ReplicationSender& from, proto::Message)> on_peer_request;
};

// Where the time of shipping goes, summed over the link's frames since the
// sender started (issue 42: the stages of the stream). A sending thread runs
// read -> encode -> write for each frame, one after the other; ack is the
// time from a frame's write to the peer's Ack that covers it (the round trip
// plus the peer's queue, apply and sync). Microseconds.
struct ShipStages {
  uint64_t frames = 0;         // frames sent
  uint64_t record_bytes = 0;   // their record data
  uint64_t wire_bytes = 0;     // their frame bytes (compressed, header included)
  uint64_t read_us = 0;        // RecordSource::Read of the frames sent (the spool, the capture queue)
  uint64_t idle_read_us = 0;   // reads that found nothing to send
  uint64_t encode_us = 0;      // encoding and compression (FrameChannel::SendCost)
  uint64_t encode_cpu_us = 0;
  uint64_t write_us = 0;       // handing the frame to the transport: TLS, the throttle, the kernel
  uint64_t write_cpu_us = 0;   // ... of it computing (TLS, system calls); the rest waited
  uint64_t acked_frames = 0;   // frames an Ack covered (a frame sent again after a rewind counts once more in frames)
  uint64_t ack_us = 0;         // their time from write to Ack, summed

  ShipStages& operator+=(const ShipStages& o) {
    frames += o.frames;
    record_bytes += o.record_bytes;
    wire_bytes += o.wire_bytes;
    read_us += o.read_us;
    idle_read_us += o.idle_read_us;
    encode_us += o.encode_us;
    encode_cpu_us += o.encode_cpu_us;
    write_us += o.write_us;
    write_cpu_us += o.write_cpu_us;
    acked_frames += o.acked_frames;
    ack_us += o.ack_us;
    return *this;
  }
};

struct LinkStats {
  bool connected = false;
  uint64_t connects = 0;
  uint64_t disconnects = 0;
  uint64_t busy_nacks = 0;
  uint64_t gap_nacks = 0;
  std::string last_error;  // why the last connection attempt or session ended; kept until a volume opens
  ShipStages stages;
};

class ReplicationSender {
 public:
  using StreamId = size_t;

  explicit ReplicationSender(SenderOptions options);
  ~ReplicationSender();  // Stop()s
  ReplicationSender(const ReplicationSender&) = delete;
  ReplicationSender& operator=(const ReplicationSender&) = delete;

  // Ships `source` from now on (opened on the current or next connection).
  // `source` must outlive the sender.
  StreamId AddStream(RecordSource* source);
  // Stops shipping the stream for good (see "RemoveStream" above). The sender
  // starts no new call on its source once this returns; one already under way
  // on another thread may still finish, so the source must still outlive the
  // sender. Later calls naming `id` fail with kNotFound. Idempotent.
  void RemoveStream(StreamId id);

  void Start();
  // Closes the connection, fails pending calls (Hash, HashAsync, CallAsync)
  // and joins the threads. Idempotent.
  void Stop();

  // New records may be waiting (wakes idle workers at once instead of at
  // their next 20 ms poll; a worker lingering for a small frame to grow is
  // left to its linger).
  void Notify();

  // Ends the current connection, if any; the next one (after the usual
  // backoff) opens every stream again with a fresh OpenMessage() — a new
  // generation after a re-protect. Pending calls fail as on any drop.
  void Reconnect();

  // Waits at most `timeout` until the peer answered the stream's VolumeOpen on
  // the current connection. The peer's durable sequence; kUnavailable when not
  // connected in time (at once if the last attempt failed), or the refusal as
  // kPermissionDenied. A failed-over refusal is answered only once
  // source.Fenced has returned, so a caller that sees it finds the fence
  // recorded (a PS never answers an agent's open in between).
  Result<uint64_t> WaitOpened(StreamId id, std::chrono::milliseconds timeout);

  // Sends `request` for the stream (volume_id and request_id are filled in
  // here) and waits at most `timeout` for the answer, whose ids are the
  // peer's. kUnavailable if not connected, the connection drops, the peer
  // answers with Nack{kInternal} or the time runs out.
  Result<proto::HashResponse> Hash(StreamId id, const proto::HashRequest& request, std::chrono::milliseconds timeout);
  // The same without waiting: `done` is called exactly once, with the answer
  // or the error (kUnavailable at once when the stream is not open on a
  // connection now; later when the connection drops, the peer nacks or the
  // sender stops). It runs on the caller's or the reader's thread without
  // the sender's lock held, and must not block. Many may be outstanding.
  using HashCallback = std::function<void(Result<proto::HashResponse>)>;
  void HashAsync(StreamId id, const proto::HashRequest& request, HashCallback done);

  // Sends a name-addressed request — a FailbackPlanRequest or a PullRequest;
  // its request_id is replaced by a fresh one here — on the current
  // connection, whether or not any stream is open, and calls `done` exactly
  // once: with the peer's answer (a FailbackPlan or a PullResponse carrying
  // that fresh request_id: the caller substitutes its own), or with the
  // error: kInvalidArgument at once for another message type, kUnavailable
  // at once when not connected (or stopping), later when the send fails, the
  // connection drops or the sender stops. Like HashAsync, `done` runs on the
  // caller's or the reader's thread without the sender's lock held and must
  // not block. Many may be outstanding.
  // `bytes`, when given, adds the request's and the answer's frame sizes
  // (before `done` runs).
  using CallCallback = std::function<void(Result<proto::Message>)>;
  void CallAsync(proto::Message request, CallCallback done, std::shared_ptr<CallBytes> bytes = nullptr);

  // Sends `m` (a GroupHeld: the answer to a peer's request) on the current
  // connection. kUnavailable when not connected or the send fails. Blocks
  // while the transport does: not for the reader's thread.
  Status Send(const proto::Message& m);

  bool connected() const { return connected_.load(); }
  // Waits at most `timeout` for a connection (a call sent now goes out);
  // false when there is none by then or the sender stops.
  bool WaitConnected(std::chrono::milliseconds timeout);
  // "connected", "connecting" or "disconnected: <why>".
  std::string state() const;
  LinkStats Stats() const;

 private:
  struct Stream;
  struct Session;
  static constexpr size_t kNoStream = ~size_t(0);
  // One outstanding call (Hash, HashAsync, CallAsync), by request_id in calls_.
  struct PendingCall {
    size_t stream = kNoStream;  // a hash call's stream; kNoStream for CallAsync
    proto::MsgType answer{};    // the message type that answers it
    bool done = false;
    Status status;
    proto::Message response;
    bool async = false;     // HashAsync/CallAsync: the completer removes it from calls_
    CallCallback callback;  // async; called once done is set, outside mu_
    std::shared_ptr<CallBytes> bytes;  // CallAsync's, may be null
  };
  // Marks `c` done with `why` (mu_ held); its callback goes to `after`.
  static void FailCall(PendingCall& c, const Status& why, std::vector<std::function<void()>>* after);
  // Registers an async call answered by `answer` (mu_ held): the fresh request_id.
  uint64_t AddCallLocked(size_t stream, proto::MsgType answer, CallCallback done,
                         std::shared_ptr<CallBytes> bytes = nullptr);
  // Sends an async call's request; if that fails and the call is still
  // pending, fails it with the send's error.
  void SendCall(const std::shared_ptr<FrameChannel>& ch, const proto::Message& request, uint64_t request_id,
                CallBytes* bytes = nullptr);
  // Every stream that is not removed is stalled, and one of them not by a
  // refusal of its open as failed over (mu_ held): a new connection may help.
  bool AllStalledLocked() const;
  // A call is pending, or one was made less than call_hold_ms ago (mu_ held).
  bool CallsHoldSessionLocked(uint64_t now_us) const;

  void Run();
  Status RunSession(const std::shared_ptr<FrameChannel>& ch);
  Status SendLoop(Session& s, int worker);
  Status ShipOne(Session& s, Stream& st, bool* sent);  // *sent: a frame went out
  void ReadLoop(Session& s);
  void Handle(Session& s, proto::Message& m, uint64_t frame_bytes);
  void Rewind(Stream& st, uint64_t next);  // mu_ held
  void Stall(Stream& st, const Status& why);  // mu_ held; the source is told after
  bool SleepMs(uint64_t ms);  // false if Stop() cut it short

  SenderOptions opt_;
  const std::shared_ptr<spdlog::logger> log_;  // looked up once, not per frame
  std::atomic<bool> stop_{false};
  std::atomic<bool> connected_{false};
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // workers, open and hash waiters
  std::vector<std::unique_ptr<Stream>> streams_;
  std::map<uint32_t, Stream*> by_handle_;
  std::deque<Stream*> open_fifo_;  // VolumeOpens awaiting their answer, in order
  std::shared_ptr<FrameChannel> channel_;
  uint64_t epoch_ = 0;             // bumped per connection
  Status session_error_;           // set by the reader/handler: the session must end
  uint64_t notifies_ = 0;
  int idle_workers_ = 0;           // workers waiting for notifies_ to move (Notify wakes only them)
  uint64_t next_request_id_ = 1;
  std::map<uint64_t, std::shared_ptr<PendingCall>> calls_;
  uint64_t last_call_us_ = 0;      // when the last call was made (0: never)
  Status all_stalled_;             // every stream stalled while calls held the session
  LinkStats stats_;
  std::vector<std::pair<RecordSource*, Status>> stall_notes_;  // told outside mu_
};

}  // namespace cdp::repl
