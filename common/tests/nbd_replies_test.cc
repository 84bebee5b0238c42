// SPDX-License-Identifier: Apache-2.0
// The structured replies' layout (common/nbd/nbd_replies.h), byte by byte.
#include <catch2/catch.hpp>

#include "common/nbd/nbd_proto.h"
#include "common/nbd/nbd_replies.h"

namespace cdp::nbd {
namespace {

DeviceExtent Data(uint64_t n) { return DeviceExtent{n, false, false}; }
DeviceExtent Hole(uint64_t n) { return DeviceExtent{n, true, true}; }
DeviceExtent Zero(uint64_t n) { return DeviceExtent{n, false, true}; }

uint32_t BE32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }
uint16_t BE16(const uint8_t* p) { return uint16_t(p[0] << 8 | p[1]); }

TEST_CASE("nbd replies: extents are clipped to the request, a shortfall is data, like kinds merge") {
  CHECK(ClipExtents({Data(100), Hole(100)}, 150) == std::vector<DeviceExtent>{Data(100), Hole(50)});
  CHECK(ClipExtents({Hole(10)}, 30) == std::vector<DeviceExtent>{Hole(10), Data(20)});
  CHECK(ClipExtents({}, 4096) == std::vector<DeviceExtent>{Data(4096)});
  CHECK(ClipExtents({Data(10), Data(0), Data(10), Zero(5)}, 25) == std::vector<DeviceExtent>{Data(20), Zero(5)});
}

TEST_CASE("nbd replies: a READ plan makes holes of zero runs of a block or more, at most 64 chunks, covering the READ") {
  SECTION("a zero run under one block is read as data") {
    CHECK(PlanRead(8192, {Data(4096), Zero(4095), Data(1)}) == std::vector<ReadChunk>{{8192, 8192, false}});
    CHECK(PlanRead(0, {Data(4096), Hole(4096), Data(4096)}) ==
          std::vector<ReadChunk>{{0, 4096, false}, {4096, 4096, true}, {8192, 4096, false}});
  }
  SECTION("200 holes: 31 holes and 31 data chunks, the last data chunk running to the end") {
    std::vector<DeviceExtent> ext;
    for (int i = 0; i < 200; ++i) ext.insert(ext.end(), {Hole(8192), Data(4096)});
    const std::vector<ReadChunk> plan = PlanRead(1 << 20, ext);
    REQUIRE(plan.size() == 62);
    uint64_t at = 1 << 20;
    for (const ReadChunk& c : plan) {
      CHECK(c.offset == at);
      at += c.length;
    }
    CHECK(at == (1u << 20) + 200 * 12288);
    CHECK_FALSE(plan.back().hole);
    CHECK(plan.back().length == 4096 + 169 * 12288);
    CHECK(ReadReplySize(plan) == 31 * (20 + 12) + 31 * (20 + 8) + (12288 * 200 - 8192 * 31));
  }
}

TEST_CASE("nbd replies: READ chunk, ERROR chunk and NONE chunk headers are as the protocol says") {
  uint8_t b[64] = {};
  REQUIRE(EncodeReadChunk(b, 0x1122334455667788ull, ReadChunk{4096, 8192, true}, false) == 32);
  CHECK(BE32(b) == kStructuredReplyMagic);
  CHECK(BE16(b + 4) == 0);
  CHECK(BE16(b + 6) == kReplyTypeOffsetHole);
  CHECK(BE32(b + 8) == 0x11223344u);
  CHECK(BE32(b + 12) == 0x55667788u);
  CHECK(BE32(b + 16) == 12);
  CHECK(BE32(b + 20) == 0);
  CHECK(BE32(b + 24) == 4096);
  CHECK(BE32(b + 28) == 8192);
  REQUIRE(EncodeReadChunk(b, 7, ReadChunk{1, 512, false}, true) == 28);
  CHECK(BE16(b + 4) == kReplyFlagDone);
  CHECK(BE16(b + 6) == kReplyTypeOffsetData);
  CHECK(BE32(b + 16) == 8 + 512);

  const Bytes err = EncodeErrorChunk(9, kEIO);
  REQUIRE(err.size() == 26);
  CHECK(BE16(err.data() + 4) == kReplyFlagDone);
  CHECK(BE16(err.data() + 6) == kReplyTypeError);
  CHECK(BE32(err.data() + 16) == 6);
  CHECK(BE32(err.data() + 20) == kEIO);
  CHECK(BE16(err.data() + 24) == 0);

  const Bytes none = EncodeDoneChunk(9);
  REQUIRE(none.size() == 20);
  CHECK(BE16(none.data() + 6) == kReplyTypeNone);
  CHECK(BE32(none.data() + 16) == 0);
}

TEST_CASE("nbd replies: BLOCK_STATUS descriptors split long extents, stop at the request and the cap, REQ_ONE gives one") {
  SECTION("an 8 GiB hole is split into u32 lengths, block aligned, ending at the request") {
    const uint64_t len = 8ull << 30;
    const auto d = BlockStatusDescriptors({Hole(len + 4096)}, len, false);
    REQUIRE(d.size() == 3);
    CHECK(d[0] == StatusDescriptor{0xfffff000u, kStateHole | kStateZero});
    CHECK(d[1] == StatusDescriptor{0xfffff000u, kStateHole | kStateZero});
    CHECK(d[2] == StatusDescriptor{uint32_t(len - 2ull * 0xfffff000u), kStateHole | kStateZero});
  }
  SECTION("data and zeros, the device's last extent past the request") {
    const auto d = BlockStatusDescriptors({Data(4096), Zero(4096), Data(1 << 20)}, 12288, false);
    CHECK(d == std::vector<StatusDescriptor>{{4096, 0}, {4096, kStateZero}, {4096, 0}});
  }
  SECTION("REQ_ONE") {
    CHECK(BlockStatusDescriptors({Data(4096), Zero(4096)}, 8192, true) == std::vector<StatusDescriptor>{{4096, 0}});
  }
  SECTION("at most kMaxDeviceExtents") {
    std::vector<DeviceExtent> ext;
    for (int i = 0; i < 1000; ++i) ext.insert(ext.end(), {Data(512), Hole(512)});
    CHECK(BlockStatusDescriptors(ext, 1000 * 1024, false).size() == kMaxDeviceExtents);
  }
  const Bytes b = EncodeBlockStatus(5, kBaseAllocationId, {{4096, 0}, {8192, kStateHole | kStateZero}});
  REQUIRE(b.size() == 20 + 4 + 16);
  CHECK(BE16(b.data() + 4) == kReplyFlagDone);
  CHECK(BE16(b.data() + 6) == kReplyTypeBlockStatus);
  CHECK(BE32(b.data() + 16) == 20);
  CHECK(BE32(b.data() + 20) == kBaseAllocationId);
  CHECK(BE32(b.data() + 24) == 4096);
  CHECK(BE32(b.data() + 28) == 0);
  CHECK(BE32(b.data() + 32) == 8192);
  CHECK(BE32(b.data() + 36) == (kStateHole | kStateZero));
}

TEST_CASE("nbd replies: known data is the last answer's data ranges only, adjacent ones joined") {
  KnownData k;
  CHECK_FALSE(k.Covers(0, 1));
  k.Remember(1 << 20, {{4096, 0}, {4096, 0}, {4096, kStateZero}, {4096, kStateHole}});
  CHECK(k.Covers(1 << 20, 8192));            // two data descriptors, one range
  CHECK(k.Covers((1 << 20) + 100, 4000));
  CHECK_FALSE(k.Covers((1 << 20) - 1, 2));   // starts before
  CHECK_FALSE(k.Covers(1 << 20, 8193));      // runs into the zeros
  CHECK(k.Covers((1 << 20) + 12288, 4096));  // a hole that is not zero is data for a READ
  CHECK_FALSE(k.Covers((1 << 20) + 4096, 8192 + 4096));
  k.Remember(0, {{512, kStateZero}});
  CHECK_FALSE(k.Covers(1 << 20, 4096));  // replaced, not added to
}

}  // namespace
}  // namespace cdp::nbd
