// SPDX-License-Identifier: Apache-2.0
// RemoteDevice: a BlockDevice (common/nbd/block_device.h) whose blocks live
// in another NBD server's export, reached through one NbdClient
// (common/nbd/nbd_client.h). `cdpctl serve` stacks a SealedDevice
// (common/nbd/sealed_device.h) on one to decrypt a sealed volume's export at
// the tenant's site, and serves the result on a local socket.
//
// Requests are split at the server's maximum block size and run one at a
// time on the one connection (a mutex): the local clients' parallelism is not
// carried to the remote server. Flush() forwards NBD_CMD_FLUSH; `fua` is
// forwarded. A failed request breaks the connection (NbdClient's rule): every
// later call fails with the first error, and the device must be recreated.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <mutex>

#include "common/nbd/block_device.h"
#include "common/nbd/nbd_client.h"

namespace cdp {

class RemoteDevice final : public BlockDevice {
 public:
  explicit RemoteDevice(std::unique_ptr<NbdClient> client) : client_(std::move(client)) {}
  ~RemoteDevice() override;

  uint64_t size() const override { return client_->size(); }
  bool read_only() const override { return client_->read_only(); }
  BlockDeviceFeatures features() const override;
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override;
  Status Write(uint64_t offset, ByteSpan data, bool fua) override;
  Status WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) override;
  Status Trim(uint64_t offset, uint64_t len, bool fua) override;
  Status Flush() override;

 private:
  std::mutex mu_;
  std::unique_ptr<NbdClient> client_;  // guarded by mu_ (size and flags are fixed)
};

}  // namespace cdp
