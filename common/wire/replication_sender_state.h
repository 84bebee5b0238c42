// SPDX-License-Identifier: Apache-2.0
// ReplicationSender's per-stream and per-session state, shared by its two
// files and nothing else: replication_sender.cc (streams, the connect loop,
// sessions and the sending threads) and replication_sender_receive.cc (the
// reader: opens, acks, nacks and the answers to calls; WaitOpened and the
// calls). The members are guarded as replication_sender.h says (mu_).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>

#include "common/wire/replication_sender.h"

namespace cdp::repl {

using Millis = std::chrono::milliseconds;

struct ReplicationSender::Stream {
  size_t id = 0;
  RecordSource* src = nullptr;
  std::string name;         // the volume, for log lines
  int worker = 0;           // the sending thread that ships it
  bool open_sent = false;
  bool opened = false;      // the open was answered (and the source resumed)
  bool removed = false;     // RemoveStream: never opened, read or told anything again
  bool fenced_open = false; // this connection's open was refused as failed over
  // The refusal is failed over and source->Fenced has not returned yet: the
  // refusal is not answered to WaitOpened before the source has recorded the
  // fence (a PS must never open an agent's volume in between).
  bool fence_pending = false;
  bool resuming = false;    // the reader is telling the source where the peer stands
  Status open_error;        // the peer refused the open
  Status stalled;           // not ok: shipping stopped until the next connection
  uint32_t handle = 0;      // the peer's volume_id
  uint64_t open_durable = 0;
  uint64_t next = 1;        // next sequence to send
  uint64_t acked = 0;       // the peer's durable sequence
  uint64_t sent_max = 0;    // the highest sequence ever sent or told by an open
  uint64_t gap_expected = 0;  // the last gap rewind target (repeats are ignored)
  uint64_t rewinds = 0;       // bumped when `next` moves back: a racing send is not counted
  struct InFlight {
    uint64_t last = 0;     // the frame's last sequence
    uint64_t sent_us = 0;  // when its Send returned (the clock's NowMicros)
  };
  std::deque<InFlight> inflight;  // the unacknowledged frames, oldest first
  size_t window = 1;              // frames in flight at most (the source's, or max_inflight)
  uint64_t hold_until_us = 0;
};

struct ReplicationSender::Session {
  std::shared_ptr<FrameChannel> ch;
  uint64_t epoch = 0;
  std::atomic<uint64_t> last_rx_us{0};
  std::atomic<uint64_t> last_tx_us{0};
};


}  // namespace cdp::repl
