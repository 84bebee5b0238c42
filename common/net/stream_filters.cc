// SPDX-License-Identifier: Apache-2.0
#include "common/net/stream_filters.h"

#include <algorithm>
#include <vector>

namespace cdp {

namespace {

size_t TotalSize(std::span<const ByteSpan> bufs) {
  size_t n = 0;
  for (ByteSpan b : bufs) n += b.size();
  return n;
}

}  // namespace

// ---- StreamFilter ----

StreamFilter::StreamFilter(std::unique_ptr<ByteStream> next, SleepFn sleep)
    : next_(std::move(next)), sleep_(std::move(sleep)) {}

StreamFilter::~StreamFilter() = default;

Result<size_t> StreamFilter::ReadSome(std::span<uint8_t> buf, Deadline deadline) {
  return next_->ReadSome(buf, deadline);
}

Status StreamFilter::WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) {
  return next_->WriteAll(bufs, deadline);
}

void StreamFilter::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_ = true;
  }
  cv_.notify_all();
  next_->Shutdown();
}

const std::string& StreamFilter::peer() const { return next_->peer(); }

const TlsPeer* StreamFilter::tls_peer() const { return next_->tls_peer(); }

bool StreamFilter::Sleep(uint64_t micros) {
  if (sleep_) {
    if (!sleep_(micros)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    return !shut_;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::microseconds(micros), [this] { return shut_; });
  return !shut_;
}

// ---- ThrottleFilter ----

ThrottleFilter::ThrottleFilter(std::unique_ptr<ByteStream> next, Throttle* throttle, SleepFn sleep)
    : StreamFilter(std::move(next), std::move(sleep)), throttle_(throttle) {}

Status ThrottleFilter::WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) {
  const uint64_t wait = throttle_->Reserve(TotalSize(bufs));
  if (wait > 0 && !Sleep(wait)) return Status::Aborted(peer() + ": stream shut down");
  return next().WriteAll(bufs, deadline + std::chrono::microseconds(wait));
}

// ---- FaultFilter ----

FaultFilter::FaultFilter(std::unique_ptr<ByteStream> next, FaultOptions options)
    : StreamFilter(std::move(next), options.sleep), opt_(std::move(options)) {}

Status FaultFilter::WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) {
  if (opt_.delay.count() > 0 && !Sleep(uint64_t(opt_.delay.count()))) {
    return Status::Aborted(peer() + ": stream shut down");
  }
  const uint64_t begin = written_;
  const uint64_t end = begin + TotalSize(bufs);
  const bool flip = opt_.flip_at && *opt_.flip_at >= begin && *opt_.flip_at < end;
  const bool drop = opt_.drop_after && *opt_.drop_after < end;
  if (!flip && !drop) {
    Status s = next().WriteAll(bufs, deadline);
    if (s.ok()) written_ = end;
    return s;
  }
  // The faulty write: copy it (tests only), damage it, send what is allowed.
  Bytes copy;
  copy.reserve(end - begin);
  for (ByteSpan b : bufs) copy.insert(copy.end(), b.begin(), b.end());
  if (flip) copy[*opt_.flip_at - begin] ^= 0xff;
  if (drop) copy.resize(size_t(std::max(*opt_.drop_after, begin) - begin));
  const ByteSpan part(copy);
  Status s = copy.empty() ? Status::OK() : next().WriteAll(std::span<const ByteSpan>(&part, 1), deadline);
  if (!s.ok()) return s;
  written_ = begin + copy.size();
  if (!drop) return Status::OK();
  next().Shutdown();
  return Status::Unavailable(peer() + ": fault filter dropped the connection after " +
                             std::to_string(written_) + " bytes");
}

}  // namespace cdp
