// SPDX-License-Identifier: Apache-2.0
#include "common/base/asio_status.h"

#include <string>

#include <boost/asio/error.hpp>

namespace cdp {

Status FromAsioError(const boost::system::error_code& ec, std::string_view context) {
  if (!ec) return Status::OK();
  namespace e = boost::asio::error;
  std::string msg(context);
  msg += ": ";
  msg += ec.message();

  if (ec == e::eof || ec == e::connection_reset || ec == e::connection_aborted || ec == e::broken_pipe ||
      ec == e::not_connected || ec == e::shut_down || ec == e::timed_out || ec == e::network_down ||
      ec == e::network_reset || ec == e::network_unreachable || ec == e::host_unreachable ||
      ec == e::connection_refused || ec == e::host_not_found || ec == e::host_not_found_try_again ||
      ec == e::try_again) {
    return Status::Unavailable(std::move(msg));
  }
  if (ec == e::operation_aborted) return Status::Aborted(std::move(msg));
  if (ec == e::would_block) return Status::Busy(std::move(msg));
  if (ec == e::access_denied) return Status::PermissionDenied(std::move(msg));
  if (ec == e::address_in_use) return Status::AlreadyExists(std::move(msg));
  if (ec == e::no_buffer_space || ec == e::no_memory) return Status::NoSpace(std::move(msg));
  if (ec == e::invalid_argument || ec == e::bad_descriptor) return Status::InvalidArgument(std::move(msg));
  int err = ec.category() == boost::system::system_category() ? ec.value() : 0;
  return Status::IOError(std::move(msg), err);
}

}  // namespace cdp
