// SPDX-License-Identifier: Apache-2.0
#include "loadgen/data.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace cdp::loadgen {
namespace {

constexpr const char* kLevels[] = {"INFO", "INFO", "INFO", "INFO", "INFO", "INFO",
                                   "DEBUG", "DEBUG", "WARN", "ERROR"};
constexpr const char* kComponents[] = {"http",   "journal", "shipper", "auth",  "cache",
                                       "db",     "sched",   "nbd",     "gc",    "metrics",
                                       "resync", "upload"};
constexpr const char* kUsers[] = {"alice", "bob",   "carol", "dave",  "erin",  "frank",
                                  "grace", "heidi", "ivan",  "judy",  "mallory", "oscar"};
constexpr const char* kFirst[] = {"James", "Mary",  "Robert", "Patricia", "John",  "Jennifer",
                                  "Michael", "Linda", "David", "Elizabeth", "William", "Barbara",
                                  "Richard", "Susan", "Joseph", "Jessica"};
constexpr const char* kLast[] = {"Smith",  "Johnson", "Williams", "Brown",  "Jones",  "Garcia",
                                 "Miller", "Davis",   "Rodriguez", "Martinez", "Hernandez",
                                 "Lopez",  "Gonzalez", "Wilson",   "Anderson", "Thomas"};
constexpr const char* kCountries[] = {"US", "US", "US", "DE", "FR", "GB", "JP", "BR", "IN", "CA"};

template <typename T, size_t N>
constexpr size_t Len(const T (&)[N]) {
  return N;
}

uint64_t SplitMix(uint64_t* x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

std::string_view BlockKindName(BlockKind k) {
  switch (k) {
    case BlockKind::kZero:
      return "zero";
    case BlockKind::kText:
      return "text";
    case BlockKind::kDbPage:
      return "dbpage";
    case BlockKind::kRandom:
      return "random";
  }
  return "unknown";
}

DataGenerator::DataGenerator(const DataMix& mix) : mix_(mix) {
  mix_.compressibility = std::clamp(mix_.compressibility, 0.0, 1.0);
  mix_.zero_share = std::max(0.0, mix_.zero_share);
  mix_.text_share = std::max(0.0, mix_.text_share);
  mix_.db_share = std::max(0.0, mix_.db_share);
  if (mix_.zero_share + mix_.text_share + mix_.db_share <= 0) mix_.text_share = 1.0;
  if (mix_.block_size == 0) mix_.block_size = 4096;
  uint64_t x = mix_.seed;
  for (auto& s : s_) s = SplitMix(&x);
}

uint64_t DataGenerator::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

uint64_t DataGenerator::Below(uint64_t n) { return Next() % n; }

double DataGenerator::Unit() { return double(Next() >> 11) * (1.0 / 9007199254740992.0); }

BlockKind DataGenerator::NextBlock(uint8_t* dst, size_t n) {
  BlockKind kind = BlockKind::kRandom;
  if (Unit() < mix_.compressibility) {
    const double total = mix_.zero_share + mix_.text_share + mix_.db_share;
    const double u = Unit() * total;
    if (u < mix_.zero_share) {
      kind = BlockKind::kZero;
    } else if (u < mix_.zero_share + mix_.text_share) {
      kind = BlockKind::kText;
    } else {
      kind = BlockKind::kDbPage;
    }
  }
  FillBlock(kind, dst, n);
  return kind;
}

void DataGenerator::FillBlock(BlockKind kind, uint8_t* dst, size_t n) {
  ++counts_[static_cast<size_t>(kind)];
  switch (kind) {
    case BlockKind::kZero:
      std::memset(dst, 0, n);
      break;
    case BlockKind::kText:
      FillText(dst, n);
      break;
    case BlockKind::kDbPage:
      FillDbPage(dst, n);
      break;
    case BlockKind::kRandom:
      FillRandom(dst, n);
      break;
  }
}

void DataGenerator::Fill(uint8_t* dst, size_t n) {
  for (size_t pos = 0; pos < n; pos += mix_.block_size) {
    NextBlock(dst + pos, std::min(mix_.block_size, n - pos));
  }
}

Bytes DataGenerator::Generate(size_t n) {
  Bytes b(n);
  Fill(b.data(), n);
  return b;
}

void DataGenerator::FillRandom(uint8_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = Next();
    std::memcpy(dst + i, &v, 8);
  }
  if (i < n) {
    const uint64_t v = Next();
    std::memcpy(dst + i, &v, n - i);
  }
}

void DataGenerator::FillText(uint8_t* dst, size_t n) {
  char line[320];
  size_t pos = 0;
  while (pos < n) {
    clock_us_ += 1 + Below(20000);
    const uint64_t day_us = clock_us_ % 86'400'000'000ull;
    const unsigned hh = unsigned(day_us / 3'600'000'000ull);
    const unsigned mm = unsigned(day_us / 60'000'000ull % 60);
    const unsigned ss = unsigned(day_us / 1'000'000 % 60);
    const unsigned us = unsigned(day_us % 1'000'000);
    int len = std::snprintf(line, sizeof line, "2026-11-21T%02u:%02u:%02u.%06uZ %-5s [%s] ", hh, mm,
                            ss, us, kLevels[Below(Len(kLevels))],
                            kComponents[Below(Len(kComponents))]);
    const char* user = kUsers[Below(Len(kUsers))];
    const size_t room = sizeof line - size_t(len);
    char* m = line + len;
    switch (Below(8)) {
      case 0:
        len += std::snprintf(m, room,
                             "request id=%016llx method=GET path=/api/v1/volumes/%u status=%u "
                             "latency_us=%u\n",
                             static_cast<unsigned long long>(Next()), unsigned(Below(64)),
                             Below(10) == 0 ? 404u : 200u, unsigned(Below(50000)));
        break;
      case 1:
        len += std::snprintf(m, room, "flushed segment %llu (%u bytes) to /var/lib/app/journal/vol-%03u\n",
                             static_cast<unsigned long long>(++log_line_), unsigned(Below(1u << 24)),
                             unsigned(Below(32)));
        break;
      case 2:
        len += std::snprintf(m, room, "connection from 10.0.%u.%u:%u accepted, user=%s\n",
                             unsigned(Below(256)), unsigned(Below(256)),
                             unsigned(32768 + Below(28000)), user);
        break;
      case 3:
        len += std::snprintf(m, room, "checkpoint lsn=%llu pages=%u dirty=%u duration_ms=%u\n",
                             static_cast<unsigned long long>(lsn_ += Below(5000)),
                             unsigned(Below(100000)), unsigned(Below(5000)), unsigned(Below(900)));
        break;
      case 4:
        len += std::snprintf(m, room,
                             "slow query took %u ms: SELECT id, total FROM orders WHERE "
                             "customer_id = %u ORDER BY created_at DESC LIMIT 50\n",
                             unsigned(100 + Below(5000)), unsigned(Below(100000)));
        break;
      case 5:
        len += std::snprintf(m, room, "user %s logged in from 192.168.%u.%u (session %08x)\n", user,
                             unsigned(Below(16)), unsigned(Below(256)), unsigned(Next()));
        break;
      case 6:
        len += std::snprintf(m, room, "cache hit ratio %u.%02u%% (hits=%u misses=%u)\n",
                             unsigned(80 + Below(20)), unsigned(Below(100)), unsigned(Below(1u << 20)),
                             unsigned(Below(1u << 16)));
        break;
      default:
        len += std::snprintf(m, room,
                             "retrying upload part %u of %u for %s after error: connection reset by "
                             "peer\n",
                             unsigned(Below(100)), unsigned(100 + Below(100)), user);
        break;
    }
    const size_t take = std::min(n - pos, size_t(std::max(len, 0)));
    std::memcpy(dst + pos, line, take);
    pos += take;
  }
}

// A slotted page: 24-byte header, u16 slot array growing up, 64-byte rows
// growing down from the end, zeros between them (free space).
//   header: page_no u64 | lsn u64 | checksum u32 | slots u16 | free_start u16
//   row:    id u64 | customer u32 | status u8 | country char[2] | pad u8 |
//           amount_cents u64 | created_us u64 | name char[32] (space padded)
void DataGenerator::FillDbPage(uint8_t* dst, size_t n) {
  std::memset(dst, 0, n);
  constexpr size_t kHeader = 24, kRow = 64;
  if (n < kHeader) {
    FillRandom(dst, n);
    return;
  }
  const size_t capacity = (n - kHeader) / (kRow + 2);
  // Fill factor 60%..95%.
  const size_t rows = capacity * (60 + Below(36)) / 100;
  size_t row_end = n;
  for (size_t r = 0; r < rows; ++r) {
    uint8_t* row = dst + row_end - kRow;
    EncodeFixed64(row, row_id_++);
    EncodeFixed32(row + 8, uint32_t(Below(100000)));
    row[12] = uint8_t(Below(5));
    std::memcpy(row + 13, kCountries[Below(Len(kCountries))], 2);
    EncodeFixed64(row + 16, Below(1'000'000));
    clock_us_ += Below(3'000'000);
    EncodeFixed64(row + 24, clock_us_);
    char name[33];
    std::snprintf(name, sizeof name, "%-32s", "");
    const int w = std::snprintf(name, sizeof name, "%s %s", kFirst[Below(Len(kFirst))],
                                kLast[Below(Len(kLast))]);
    if (w >= 0 && size_t(w) < 32) name[w] = ' ';
    std::memcpy(row + 32, name, 32);
    EncodeFixed16(dst + kHeader + 2 * r, uint16_t((row_end - kRow) & 0xFFFF));
    row_end -= kRow;
  }
  EncodeFixed64(dst, page_no_++);
  EncodeFixed64(dst + 8, lsn_ += 1 + Below(100));
  EncodeFixed32(dst + 16, uint32_t(Next()));
  EncodeFixed16(dst + 20, uint16_t(rows));
  EncodeFixed16(dst + 22, uint16_t(kHeader + 2 * rows));
}

proto::WriteBatch MakeWriteBatch(DataGenerator& gen, uint32_t volume_id, uint64_t first_seq,
                                 uint64_t first_offset, size_t records) {
  proto::WriteBatch batch;
  batch.volume_id = volume_id;
  batch.codec = proto::Codec::kNone;
  batch.records.reserve(records);
  const size_t bs = gen.mix().block_size;
  for (size_t i = 0; i < records; ++i) {
    proto::Record r;
    r.seq = first_seq + i;
    r.offset = first_offset + i * bs;
    r.length = uint32_t(bs);
    r.kind = proto::RecordKind::kData;
    r.timestamp_us = 1'795'000'000'000'000ull + i;
    r.data.resize(bs);
    gen.NextBlock(r.data.data(), bs);
    batch.records.push_back(std::move(r));
  }
  return batch;
}

}  // namespace cdp::loadgen
