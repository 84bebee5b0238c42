// SPDX-License-Identifier: Apache-2.0
// The one place where a boost::system::error_code (from Asio or Beast) becomes
// a cdp::Status, as Status::FromErrno is for errno.
//
// Mapping (the message is always "context: <error text>"):
//   success                                  -> ok
//   eof, connection_reset, connection_aborted,
//   broken_pipe, not_connected, shut_down,
//   timed_out, network_down/unreachable,
//   host_unreachable, connection_refused,
//   host_not_found(_try_again), try_again    -> kUnavailable (retryable): the peer
//                                               is gone or not there yet; reconnect
//   operation_aborted                        -> kAborted (we cancelled or closed it)
//   would_block                              -> kBusy (retryable)
//   access_denied                            -> kPermissionDenied
//   address_in_use                           -> kAlreadyExists
//   no_buffer_space, no_memory               -> kNoSpace (retryable)
//   invalid_argument, bad_descriptor         -> kInvalidArgument
//   anything else                            -> kIOError (errno kept when it is one)
//
// Thread safety: a pure function.
#pragma once

#include <string_view>

#include <boost/system/error_code.hpp>

#include "common/base/status.h"

namespace cdp {

Status FromAsioError(const boost::system::error_code& ec, std::string_view context);

}  // namespace cdp
