// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <map>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "loadgen/churn.h"

using namespace cdp;
using namespace cdp::loadgen;

namespace {

// Records every write; each write costs `cost_us` of clock time.
class RecordingTarget final : public ChurnTarget {
 public:
  RecordingTarget(ManualClock* c, uint64_t size, uint64_t cost_us) : clock_(c), size_(size), cost_(cost_us) {}
  uint64_t size() const override { return size_; }
  Status Write(uint64_t off, ByteSpan d) override {
    if (off + d.size() > size_) return Status::OutOfRange("past end");
    offsets.push_back(off);
    clock_->Advance(cost_);
    return Status::OK();
  }
  Status Flush() override {
    ++flushes;
    return Status::OK();
  }
  Status Close() override { return Status::OK(); }
  std::string name() const override { return "recording"; }

  std::vector<uint64_t> offsets;
  int flushes = 0;

 private:
  ManualClock* clock_;
  uint64_t size_, cost_;
};

}  // namespace

TEST_CASE("Churn holds its rate within 5% on a manual clock", "[churn]") {
  for (double rate : {1e6, 20e6, 150e6}) {
    ManualClock clock;
    RecordingTarget t(&clock, 1ull << 30, 200);  // 200 us per 64 KiB write: up to ~327 MB/s
    ChurnOptions o;
    o.rate_bytes_per_sec = rate;
    o.duration_us = 30'000'000;
    o.io_size = 65536;
    auto r = RunChurn(&t, o, &clock, [&](uint64_t us) { clock.Advance(us); });
    REQUIRE(r.ok());
    INFO("rate " << rate);
    CHECK(r->elapsed_us == 30'000'000);
    CHECK(r->achieved_bytes_per_sec() == Approx(rate).epsilon(0.05));
    CHECK(r->ops == t.offsets.size());
    CHECK(r->bytes == r->ops * 65536);
  }
}

TEST_CASE("Churn reports the lower rate a slow target achieves", "[churn]") {
  ManualClock clock;
  RecordingTarget t(&clock, 1ull << 30, 10'000);  // 10 ms per 64 KiB: at most 6.55 MB/s
  ChurnOptions o;
  o.rate_bytes_per_sec = 50e6;
  o.duration_us = 10'000'000;
  auto r = RunChurn(&t, o, &clock, [&](uint64_t us) { clock.Advance(us); });
  REQUIRE(r.ok());
  CHECK(r->achieved_bytes_per_sec() == Approx(65536 / 0.01).epsilon(0.02));
}

TEST_CASE("Churn patterns: sequential wraps, random and zipf stay aligned and in range", "[churn]") {
  auto run = [](const char* pattern) {
    ManualClock clock;
    auto t = std::make_unique<RecordingTarget>(&clock, 64 * 4096 + 100, 0);
    ChurnOptions o;
    o.rate_bytes_per_sec = 4096 * 1000;
    o.duration_us = 1'000'000;
    o.io_size = 4096;
    o.pattern = *ParsePattern(pattern);
    auto r = RunChurn(t.get(), o, &clock, [&](uint64_t us) { clock.Advance(us); });
    REQUIRE(r.ok());
    return t;
  };
  auto seq = run("seq");
  REQUIRE(seq->offsets.size() >= 900);
  for (size_t i = 0; i < seq->offsets.size(); ++i) CHECK(seq->offsets[i] == (i % 64) * 4096);
  for (const char* p : {"random", "zipf:0.99"}) {
    auto t = run(p);
    std::map<uint64_t, int> hist;
    for (uint64_t off : t->offsets) {
      CHECK(off % 4096 == 0);
      CHECK(off < 64 * 4096);
      ++hist[off / 4096];
    }
    if (std::string(p) == "random") {
      CHECK(hist.size() == 64);
    } else {
      // Zipf(0.99) over 64 blocks: block 0 takes about 21% of the writes, far above uniform's 1.6%.
      CHECK(hist[0] > int(t->offsets.size() / 8));
      CHECK(hist[0] > hist[10] * 5);
    }
  }
}

TEST_CASE("Churn pattern parsing", "[churn]") {
  CHECK(ParsePattern("seq")->kind == Pattern::kSequential);
  CHECK(ParsePattern("random")->kind == Pattern::kRandom);
  CHECK(ParsePattern("zipf:0.8")->theta == 0.8);
  CHECK(ParsePattern("zipf")->theta == 0.99);
  CHECK(ParsePattern("zipf:1.5").status().code() == Code::kInvalidArgument);
  CHECK(ParsePattern("zipf:x").status().code() == Code::kInvalidArgument);
  CHECK(ParsePattern("hot").status().code() == Code::kInvalidArgument);
}

TEST_CASE("Churn on a file target writes mixed data and flushes", "[churn]") {
  auto env = NewMemEnv();
  ManualClock clock;
  auto t = OpenFileTarget(env.get(), "/vol.img", 8 << 20);
  REQUIRE(t.ok());
  CHECK((*t)->size() == (8u << 20));
  ChurnOptions o;
  o.rate_bytes_per_sec = 16e6;
  o.duration_us = 1'000'000;
  o.flush_every_bytes = 4 << 20;
  o.compressibility = 0.5;
  auto r = RunChurn(t->get(), o, &clock, [&](uint64_t us) { clock.Advance(us); });
  REQUIRE(r.ok());
  CHECK(r->bytes == 16000000 / 65536 * 65536);
  CHECK(r->flushes == 4);  // at 4, 8 and 12 MiB, and at the end
  auto data = ReadWholeFile(env.get(), "/vol.img");
  REQUIRE(data.ok());
  size_t nonzero = 0;
  for (uint8_t b : *data) nonzero += b != 0;
  CHECK(nonzero > (2u << 20));  // 8 MiB overwritten almost twice with mixed data
  // Missing file without a size: an error naming it.
  auto missing = OpenFileTarget(env.get(), "/none.img", 0);
  CHECK(missing.status().IsNotFound());
}
