// SPDX-License-Identifier: Apache-2.0
// The order of one connection's requests (common/nbd/nbd_request_order.h),
// driven alone: where each request runs, what waits, when a DISC closes.
#include <catch2/catch.hpp>

#include "common/nbd/nbd_request_order.h"

namespace cdp::nbd_detail {
namespace {

using Where = RequestOrder::Where;
using Disc = RequestOrder::Disc;

PendingRequest Req(uint16_t type, uint32_t length, uint64_t handle) {
  PendingRequest p;
  p.r.type = type;
  p.r.length = length;
  p.r.handle = handle;
  return p;
}

Where Dispatch(RequestOrder& o, uint16_t type, uint32_t length, uint64_t handle, bool more_buffered = false) {
  PendingRequest p = Req(type, length, handle);
  return o.Dispatch(&p, /*read_pool=*/true, more_buffered);
}

std::vector<uint64_t> Handles(const std::deque<PendingRequest>& q) {
  std::vector<uint64_t> h;
  for (const PendingRequest& p : q) h.push_back(p.r.handle);
  return h;
}

TEST_CASE("nbd request order: a lone small request runs here, a large or queued READ on the pool, the rest on the "
          "device strand") {
  RequestOrder o;
  CHECK(Dispatch(o, nbd::kCmdRead, 4096, 1) == Where::kHere);
  CHECK(Dispatch(o, nbd::kCmdWrite, kInlineMaxBytes, 2) == Where::kHere);
  CHECK(Dispatch(o, nbd::kCmdBlockStatus, 1u << 30, 3) == Where::kHere);
  CHECK(Dispatch(o, nbd::kCmdRead, 4096, 4, /*more_buffered=*/true) == Where::kReadPool);
  CHECK(o.reads_in_pool() == 1);
  CHECK(o.PoolReadDone().empty());
  CHECK(Dispatch(o, nbd::kCmdRead, kInlineMaxBytes + 1, 5) == Where::kReadPool);
  CHECK(o.PoolReadDone().empty());
  CHECK(Dispatch(o, nbd::kCmdWrite, kInlineMaxBytes + 1, 6) == Where::kDeviceStrand);
  // Behind a request on the device strand, everything goes there too, in order.
  CHECK(Dispatch(o, nbd::kCmdRead, 4096, 7) == Where::kDeviceStrand);
  CHECK(Dispatch(o, nbd::kCmdRead, 1u << 20, 8) == Where::kDeviceStrand);
  CHECK(o.on_device_strand() == 3);
  for (int i = 0; i < 3; ++i) o.DeviceDone();
  for (uint16_t t : {nbd::kCmdFlush, nbd::kCmdTrim, nbd::kCmdWriteZeroes}) {
    CHECK(Dispatch(o, t, 4096, 9) == Where::kDeviceStrand);
    o.DeviceDone();
  }
  // Without a read pool a large READ goes to the device strand.
  PendingRequest big = Req(nbd::kCmdRead, 1u << 20, 10);
  CHECK(o.Dispatch(&big, /*read_pool=*/false, true) == Where::kDeviceStrand);
  CHECK(o.held() == 0);
}

TEST_CASE("nbd request order: what changes data waits for the pool READs before it, and all behind it waits too") {
  RequestOrder o;
  CHECK(Dispatch(o, nbd::kCmdRead, 1u << 20, 1) == Where::kReadPool);
  CHECK(Dispatch(o, nbd::kCmdRead, 4096, 2) == Where::kReadPool);  // a pool READ is in flight
  CHECK(Dispatch(o, nbd::kCmdBlockStatus, 4096, 3) == Where::kHere);
  CHECK(Dispatch(o, nbd::kCmdWrite, 4096, 4) == Where::kHeld);
  CHECK(Dispatch(o, nbd::kCmdRead, 4096, 5) == Where::kHeld);  // must see the WRITE
  CHECK(Dispatch(o, nbd::kCmdFlush, 0, 6) == Where::kHeld);
  CHECK(o.held() == 3);
  CHECK(o.OnDisc() == Disc::kWait);
  CHECK_FALSE(o.DiscReady());
  CHECK(o.PoolReadDone().empty());  // one pool READ left
  CHECK_FALSE(o.DiscReady());
  std::deque<PendingRequest> back = o.PoolReadDone();
  CHECK(Handles(back) == std::vector<uint64_t>{4, 5, 6});
  CHECK(o.held() == 0);
  // Dispatched again, in order: the WRITE runs, the READ after it too (it
  // comes after the WRITE's reply is queued), the FLUSH on the device strand.
  CHECK(o.Dispatch(&back[0], true, false) == Where::kHere);
  CHECK(o.Dispatch(&back[1], true, false) == Where::kHere);
  CHECK(o.Dispatch(&back[2], true, false) == Where::kDeviceStrand);
  CHECK(o.DiscReady());
  CHECK_FALSE(o.DiscReady());  // once
  CHECK(o.OnDisc() == Disc::kBehindDeviceStrand);
  o.DeviceDone();
  CHECK(o.OnDisc() == Disc::kClose);
}

TEST_CASE("nbd request order: a held request released behind a READ it follows is held again") {
  RequestOrder o;
  CHECK(Dispatch(o, nbd::kCmdRead, 1u << 20, 1) == Where::kReadPool);
  CHECK(Dispatch(o, nbd::kCmdTrim, 4096, 2) == Where::kHeld);
  CHECK(Dispatch(o, nbd::kCmdRead, 1u << 20, 3) == Where::kHeld);
  CHECK(Dispatch(o, nbd::kCmdWrite, 4096, 4) == Where::kHeld);
  std::deque<PendingRequest> back = o.PoolReadDone();
  REQUIRE(back.size() == 3);
  CHECK(o.Dispatch(&back[0], true, false) == Where::kDeviceStrand);  // TRIM
  // The READ after the TRIM waits for it on the device strand, in order.
  CHECK(o.Dispatch(&back[1], true, false) == Where::kDeviceStrand);
  CHECK(o.Dispatch(&back[2], true, false) == Where::kDeviceStrand);
  o.DeviceDone();
  o.DeviceDone();
  o.DeviceDone();
  // Now a large READ goes to the pool, and a WRITE behind it is held again.
  CHECK(Dispatch(o, nbd::kCmdRead, 1u << 20, 5) == Where::kReadPool);
  CHECK(Dispatch(o, nbd::kCmdWrite, 4096, 6) == Where::kHeld);
  CHECK(o.OnDisc() == Disc::kWait);
  back = o.PoolReadDone();
  CHECK(Handles(back) == std::vector<uint64_t>{6});
  CHECK(o.Dispatch(&back[0], true, false) == Where::kHere);
  CHECK(o.DiscReady());
  CHECK(o.OnDisc() == Disc::kClose);
}

TEST_CASE("nbd request order: a refused request is ordered as one that changes data") {
  RequestOrder o;
  CHECK(Dispatch(o, nbd::kCmdRead, 1u << 20, 1) == Where::kReadPool);
  PendingRequest bad = Req(99, 0, 2);
  bad.err = 22;
  CHECK(o.Dispatch(&bad, true, false) == Where::kHeld);
}

}  // namespace
}  // namespace cdp::nbd_detail
