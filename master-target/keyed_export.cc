#include "master-target/keyed_export.h"

#include <algorithm>
#include <cstring>

#include "common/log.h"

namespace cdp::mt {

Result<std::shared_ptr<KeyedExportDevice>> KeyedExportDevice::Open(std::shared_ptr<PointInTimeDevice> inner,
                                                                    std::shared_ptr<ReplicaVolume> volume,
                                                                    uint64_t point_seq,
                                                                    std::shared_ptr<const seal::BlockSealer> sealer) {
  if (!volume->identity().sealed)
    return Status::InvalidArgument(volume->identity().name + " is not sealed: its exports need no key");
  if (!inner->read_only()) return Status::InvalidArgument("a keyed export is read-only");
  return std::shared_ptr<KeyedExportDevice>(
      new KeyedExportDevice(std::move(inner), std::move(volume), point_seq, std::move(sealer)));
}

BlockDeviceFeatures KeyedExportDevice::features() const {
  BlockDeviceFeatures f;
  f.flush = true;
  f.multi_conn = true;
  return f;
}

Status KeyedExportDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  if (offset > size() || len > size() - offset) return Status::OutOfRange("read past the end of the volume");
  if (len == 0) return Status::OK();
  const uint64_t first = offset / seal::kUnit * seal::kUnit;
  const uint64_t end = (offset + len + seal::kUnit - 1) / seal::kUnit * seal::kUnit;
  Bytes blocks(end - first);
  Bytes macs(seal::MacBytes(end - first));
  CDP_RETURN_IF_ERROR(inner_->Read(first, uint32_t(blocks.size()), blocks.data()));
  CDP_RETURN_IF_ERROR(volume_->ReadMacsAt(point_, first, blocks.size(), macs.data()));
  if (Status s = sealer_->Open(first, blocks, macs.data()); !s.ok()) {
    failures_.fetch_add(1);
    log::Get("mt.export")->error("{} keyed export at sequence {}: {}", log::Where{volume_->identity().name, "", point_},
                                 point_, s.message());
    return Status::Corruption(volume_->identity().name + ": " + s.message());
  }
  std::memcpy(buf, blocks.data() + (offset - first), len);
  return Status::OK();
}

}  // namespace cdp::mt
