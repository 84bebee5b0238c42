// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the spool's recovery (process-server/spool.h): what the
// process server reads from its spool directory at start-up.
//
// Input: up to four segment files separated by fuzz::kFileSeparator, put in an
// in-memory Env (common/env/env.h) under the names the spool gives them (from the
// first_seq in each header, so mutations keep matching names). Spool::Open then
// recovers, as at start-up, and the fuzzer uses the spool as the daemon would:
// reads every record from the oldest on, appends the next sequence, and opens
// the directory a second time.
//
// Properties: Open never crashes or reads out of range; every record Read
// returns is contiguous with the last, well-formed, and Read reports no
// corruption after a recovery that kept the record; the next sequence appends;
// a second recovery finds nothing more to repair and the same records.
#include <cstddef>
#include <cstdint>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "fuzz/fuzz_util.h"
#include "process-server/spool.h"

namespace {

using namespace cdp;
using namespace cdp::ps;
using cdp::fuzz::Check;

constexpr char kDir[] = "/spool/t/v";

Result<std::unique_ptr<Spool>> OpenSpool(Env* env, Clock* clock, SpoolRecovery* rec, uint64_t* corruptions) {
  SpoolOptions o;
  o.env = env;
  o.clock = clock;
  o.dir = kDir;
  o.segment_bytes = 4096;
  o.on_corruption = [corruptions](const Status&) { ++*corruptions; };
  return Spool::Open(o, rec);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<Env> env = NewMemEnv();
  ManualClock clock;
  Check(env->CreateDirs(kDir).ok());
  std::vector<ByteSpan> files = fuzz::SplitFiles(ByteSpan(data, size), 4);
  for (size_t i = 0; i < files.size(); ++i) {
    uint64_t first = files[i].size() >= 24 ? DecodeFixed64(files[i].data() + 16) : i + 1;
    OpenOptions o;
    o.create = true;
    o.truncate = true;
    auto f = env->Open(JoinPath(kDir, seglog::FileName(first, kSpoolSegmentSuffix)), o);
    Check(f.ok() && (*f)->Append(files[i]).ok());
  }

  SpoolRecovery rec;
  uint64_t corruptions = 0;
  auto spool = OpenSpool(env.get(), &clock, &rec, &corruptions);
  if (!spool.ok()) return 0;
  Spool& s = **spool;
  const SpoolStats st = s.stats();
  Check(st.segments == rec.segments);
  Check(st.backlog_records <= rec.records);

  // Everything recovered reads back, in order.
  uint64_t next = st.first_seq;
  uint64_t read = 0;
  while (st.backlog_records > 0 && next <= st.durable_seq) {
    auto got = s.Read(next, 64 << 10);
    Check(got.ok() && !got->empty());
    for (const proto::Record& r : *got) {
      Check(r.seq == next);
      Check(r.kind != proto::RecordKind::kData || (r.data.size() == r.length && r.length > 0));
      ++next;
      ++read;
    }
  }
  Check(read == st.backlog_records);

  // The next write of the volume appends.
  const uint64_t durable = s.durable_seq();
  uint64_t records = st.backlog_records;
  if (durable < UINT64_MAX - 1) {
    proto::Record r;
    r.seq = durable + 1;
    r.offset = 4096;
    r.length = 8;
    r.kind = proto::RecordKind::kData;
    r.data = Bytes(8, 0x5a);
    std::vector<proto::Record> batch;
    batch.push_back(std::move(r));
    AppendResult a = s.Append(std::move(batch));
    Check(a.status.ok() && a.durable_seq == durable + 1 && a.appended == 1);
    ++records;
  }
  const uint64_t durable_after = s.durable_seq();
  spool->reset();

  // A second start-up finds a clean spool with the same records.
  SpoolRecovery rec2;
  uint64_t corruptions2 = 0;
  auto again = OpenSpool(env.get(), &clock, &rec2, &corruptions2);
  Check(again.ok());
  Check(rec2.corrupt_records == 0 && rec2.truncated_bytes == 0 && corruptions2 == 0);
  Check((*again)->durable_seq() == durable_after);
  Check((*again)->stats().backlog_records == records);
  return 0;
}
