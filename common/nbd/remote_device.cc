// SPDX-License-Identifier: Apache-2.0
#include "common/nbd/remote_device.h"

#include <algorithm>
#include <vector>

namespace cdp {

RemoteDevice::~RemoteDevice() {
  std::lock_guard<std::mutex> lk(mu_);
  (void)client_->Close();
}

BlockDeviceFeatures RemoteDevice::features() const {
  BlockDeviceFeatures f;
  f.flush = client_->can_flush();
  f.fua = client_->can_flush();
  f.write_zeroes = !client_->read_only();  // emulated with writes when the server lacks it
  f.trim = !client_->read_only();
  return f;
}

Status RemoteDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint32_t step = client_->max_block();
  for (uint32_t done = 0; done < len;) {
    const uint32_t n = std::min(step, len - done);
    CDP_RETURN_IF_ERROR(client_->Read(offset + done, n, buf + done));
    done += n;
  }
  return Status::OK();
}

Status RemoteDevice::Write(uint64_t offset, ByteSpan data, bool fua) {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t step = client_->max_block();
  for (size_t done = 0; done < data.size();) {
    const size_t n = std::min(step, data.size() - done);
    CDP_RETURN_IF_ERROR(client_->Write(offset + done, data.subspan(done, n), fua && done + n == data.size()));
    done += n;
  }
  // The replies are collected here, not by a later call: the local client is
  // answered with this write's own outcome.
  return client_->Drain();
}

Status RemoteDevice::WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t step = client_->max_block();
  std::vector<uint8_t> zeros;
  for (uint64_t done = 0; done < len;) {
    const uint32_t n = uint32_t(std::min(step, len - done));
    const bool last_fua = fua && done + n == len;
    if (client_->can_write_zeroes()) {
      CDP_RETURN_IF_ERROR(client_->WriteZeroes(offset + done, n, last_fua, may_trim));
    } else {
      zeros.resize(n);
      CDP_RETURN_IF_ERROR(client_->Write(offset + done, zeros, last_fua));
    }
    done += n;
  }
  return client_->Drain();
}

Status RemoteDevice::Trim(uint64_t offset, uint64_t len, bool fua) { return WriteZeroes(offset, len, fua, true); }

Status RemoteDevice::Flush() {
  std::lock_guard<std::mutex> lk(mu_);
  return client_->Flush();
}

}  // namespace cdp
