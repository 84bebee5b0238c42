// SPDX-License-Identifier: Apache-2.0
// The order of one connection's requests: nbd_request_order.h.
#include "common/nbd/nbd_request_order.h"

namespace cdp::nbd_detail {

RequestOrder::Where RequestOrder::Dispatch(PendingRequest* p, bool read_pool, bool more_buffered) {
  const nbd::Request& r = p->r;
  const bool read = r.type == nbd::kCmdRead;
  const bool changes_nothing = read || r.type == nbd::kCmdBlockStatus;
  if (!held_.empty() || (!changes_nothing && reads_in_pool_ > 0)) {
    held_.push_back(std::move(*p));
    return Where::kHeld;
  }
  if (on_device_strand_ == 0) {
    if (read && read_pool && (r.length > kInlineMaxBytes || reads_in_pool_ > 0 || more_buffered)) {
      ++reads_in_pool_;
      return Where::kReadPool;
    }
    const bool small =
        ((read || r.type == nbd::kCmdWrite) && r.length <= kInlineMaxBytes) || r.type == nbd::kCmdBlockStatus;
    if (small) return Where::kHere;
  }
  ++on_device_strand_;
  return Where::kDeviceStrand;
}

void RequestOrder::DeviceDone() { --on_device_strand_; }

std::deque<PendingRequest> RequestOrder::PoolReadDone() {
  std::deque<PendingRequest> q;
  if (--reads_in_pool_ == 0) q.swap(held_);
  return q;
}

RequestOrder::Disc RequestOrder::OnDisc() {
  if (reads_in_pool_ > 0 || !held_.empty()) {
    disc_waiting_ = true;
    return Disc::kWait;
  }
  return on_device_strand_ > 0 ? Disc::kBehindDeviceStrand : Disc::kClose;
}

bool RequestOrder::DiscReady() {
  if (!disc_waiting_ || !held_.empty() || reads_in_pool_ > 0) return false;
  disc_waiting_ = false;
  return true;
}

}  // namespace cdp::nbd_detail
