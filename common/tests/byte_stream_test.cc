// SPDX-License-Identifier: Apache-2.0
// ByteStream transports (TCP, unix, socketpair) and the stream filters
// (throttle, fault), alone and under a FrameChannel.
#include <catch2/catch.hpp>

#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "common/base/clock.h"
#include "common/net/byte_stream.h"
#include "common/net/stream_filters.h"
#include "common/net/throttle.h"
#include "common/wire/channel.h"

namespace cdp {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;
using tcp = asio::ip::tcp;
using Streams = std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>>;

ByteStream::Deadline In(milliseconds d) { return std::chrono::steady_clock::now() + d; }

Streams StreamPair() {
  auto p = MakeStreamPair("test");
  REQUIRE(p.ok());
  return std::move(*p);
}

Status WriteText(ByteStream& s, const std::string& text) {
  const ByteSpan span(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  return s.WriteAll(std::span<const ByteSpan>(&span, 1), In(milliseconds(5000)));
}

// Reads until `n` bytes came or the stream fails; *end gets the failure (OK if none).
Bytes ReadUpTo(ByteStream& s, size_t n, Status* end) {
  Bytes got(n);
  size_t have = 0;
  *end = Status::OK();
  while (have < n) {
    Result<size_t> r = s.ReadSome(std::span<uint8_t>(got.data() + have, n - have), In(milliseconds(5000)));
    if (!r.ok()) {
      *end = r.status();
      break;
    }
    have += *r;
  }
  got.resize(have);
  return got;
}

std::string ReadText(ByteStream& s, size_t n) {
  Status end;
  Bytes b = ReadUpTo(s, n, &end);
  REQUIRE(end.ok());
  return std::string(b.begin(), b.end());
}

void CheckRoundTrip(ByteStream& a, ByteStream& b) {
  REQUIRE(WriteText(a, "hello from a").ok());
  CHECK(ReadText(b, 12) == "hello from a");
  REQUIRE(WriteText(b, "and back").ok());
  CHECK(ReadText(a, 8) == "and back");
}

FaultOptions DropAfter(uint64_t n) {
  FaultOptions o;
  o.drop_after = n;
  return o;
}

FaultOptions FlipAt(uint64_t offset) {
  FaultOptions o;
  o.flip_at = offset;
  return o;
}

// A listening socket on 127.0.0.1 with an ephemeral port.
struct TcpListener {
  asio::io_context ctx;
  tcp::acceptor acceptor{ctx, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  // Accepts one connection in another thread and returns adopt(socket).
  template <typename Adopt>
  auto AcceptAsync(Adopt adopt) {
    return std::async(std::launch::async, [this, adopt] {
      tcp::socket s(ctx);
      acceptor.accept(s);
      return adopt(std::move(s));
    });
  }
};

// A SleepFn that advances a ManualClock instead of waiting.
SleepFn ManualSleep(ManualClock& clock) {
  return [&clock](uint64_t micros) {
    clock.Advance(micros);
    return true;
  };
}

TEST_CASE("TCP transport round-trips bytes both ways", "[stream]") {
  TcpListener l;
  auto server = l.AcceptAsync([](tcp::socket s) { return MakeSocketStream(std::move(s)); });
  auto client = ConnectTcpStream("127.0.0.1", l.acceptor.local_endpoint().port(), milliseconds(5000));
  REQUIRE(client.ok());
  auto srv = server.get();
  REQUIRE(srv.ok());
  CHECK((*client)->peer().rfind("127.0.0.1:", 0) == 0);
  CheckRoundTrip(**client, **srv);
}

// In a network namespace of its own whose only ephemeral port is kPort,
// connecting to kPort (nothing listening) draws kPort as the source port: TCP
// simultaneous open connects the socket to itself. Root only (unshare).
TEST_CASE("TCP connect refuses a socket connected to itself, so the port stays free to bind", "[stream]") {
  constexpr uint16_t kPort = 40000;
  std::string failure;
  std::thread t([&] {
    // A net namespace is per thread: this thread's sockets and its view of
    // /proc/sys/net are the new namespace's.
    if (::unshare(CLONE_NEWNET) != 0) {
      failure = std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno);
      return;
    }
    int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    bool up = fd >= 0 && ::ioctl(fd, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags |= IFF_UP) &&
              ::ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
    if (fd >= 0) ::close(fd);
    if (!up) {
      failure = "cannot bring lo up";
      return;
    }
    std::ofstream range("/proc/sys/net/ipv4/ip_local_port_range");
    range << kPort << " " << kPort << "\n";
    range.close();
    if (!range) {
      failure = "cannot set ip_local_port_range";
      return;
    }
    asio::io_context ctx;
    const tcp::endpoint there(asio::ip::make_address("127.0.0.1"), kPort);
    {
      // Positive control: a plain socket does connect to itself here.
      tcp::socket raw(ctx);
      boost::system::error_code ec;
      raw.connect(there, ec);
      if (ec || raw.local_endpoint() != raw.remote_endpoint()) {
        failure = "the kernel did not connect a socket to itself: the test proves nothing";
        return;
      }
      raw.set_option(asio::socket_base::linger(true, 0));  // reset: the port is free again at once
      raw.close();  // (asio's destructor would drop the linger option first)
    }
    auto c = ConnectTcpStream("127.0.0.1", kPort, milliseconds(2000));
    if (c.ok()) {
      failure = "ConnectTcpStream kept a socket connected to itself";
      return;
    }
    if (c.status().code() != Code::kUnavailable || c.status().message().find("connected to itself") == std::string::npos) {
      failure = "unexpected error: " + c.status().ToString();
      return;
    }
    // The refused socket is closed: a daemon can listen on the port at once.
    tcp::acceptor a(ctx);
    boost::system::error_code ec;
    a.open(tcp::v4(), ec);
    if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) a.bind(there, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) failure = "bind after the refused connect: " + ec.message();
  });
  t.join();
  INFO(failure);
  CHECK(failure.empty());
}

TEST_CASE("unix transport round-trips bytes both ways", "[stream]") {
  const std::string path = "/tmp/cdp-stream-test-" + std::to_string(::getpid()) + ".sock";
  ::unlink(path.c_str());
  asio::io_context ctx;
  asio::local::stream_protocol::acceptor acceptor(ctx, asio::local::stream_protocol::endpoint(path));
  auto server = std::async(std::launch::async, [&] {
    asio::local::stream_protocol::socket s(ctx);
    acceptor.accept(s);
    return MakeSocketStream(std::move(s));
  });
  auto client = ConnectUnixStream(path, milliseconds(5000));
  REQUIRE(client.ok());
  auto srv = server.get();
  REQUIRE(srv.ok());
  CHECK((*client)->peer() == "unix:" + path);
  CheckRoundTrip(**client, **srv);
  ::unlink(path.c_str());
  CHECK(ConnectUnixStream(path, milliseconds(5000)).status().code() == Code::kUnavailable);
}

TEST_CASE("a read timeout is kBusy, Shutdown wakes a blocked reader", "[stream]") {
  auto [a, b] = StreamPair();
  std::array<uint8_t, 16> buf{};
  CHECK(b->ReadSome(buf, In(milliseconds(20))).status().code() == Code::kBusy);
  auto reader = std::async(std::launch::async, [&b = b, &buf] { return b->ReadSome(buf, In(milliseconds(60000))); });
  b->Shutdown();
  CHECK(reader.get().status().code() == Code::kAborted);
  // The peer sees EOF.
  CHECK(a->ReadSome(buf, In(milliseconds(5000))).status().code() == Code::kUnavailable);
}

TEST_CASE("a plain filter forwards everything", "[stream]") {
  auto [a, b] = StreamPair();
  const std::string peer = a->peer();
  StreamFilter f(std::move(a));
  CHECK(f.peer() == peer);
  CheckRoundTrip(f, *b);
}

TEST_CASE("fault filter drops the connection after exactly N bytes", "[stream]") {
  auto [a, b] = StreamPair();
  FaultFilter f(std::move(a), DropAfter(1000));
  const std::string chunk(600, 'x');
  REQUIRE(WriteText(f, chunk).ok());
  CHECK(WriteText(f, chunk).code() == Code::kUnavailable);
  CHECK(f.written() == 1000);
  Status end;
  Bytes got = ReadUpTo(*b, 5000, &end);
  CHECK(got.size() == 1000);
  CHECK(end.code() == Code::kUnavailable);
}

TEST_CASE("fault filter flips exactly the byte at offset N", "[stream]") {
  auto [a, b] = StreamPair();
  FaultFilter f(std::move(a), FlipAt(13));
  REQUIRE(WriteText(f, std::string(10, 'a')).ok());
  REQUIRE(WriteText(f, std::string(10, 'b')).ok());
  std::string got = ReadText(*b, 20);
  std::string want = std::string(10, 'a') + std::string(10, 'b');
  want[13] = char(uint8_t('b') ^ 0xff);
  CHECK(got == want);
}

TEST_CASE("fault filter waits its delay before every write", "[stream]") {
  auto [a, b] = StreamPair();
  ManualClock clock;
  const uint64_t start = clock.NowMicros();
  std::vector<uint64_t> written_at_sleep;
  FaultFilter* fp = nullptr;
  FaultOptions o;
  o.delay = std::chrono::microseconds(5000);
  o.sleep = [&](uint64_t micros) {
    written_at_sleep.push_back(fp->written());
    clock.Advance(micros);
    return true;
  };
  FaultFilter f(std::move(a), o);
  fp = &f;
  for (int i = 0; i < 3; ++i) REQUIRE(WriteText(f, "abcd").ok());
  CHECK(clock.NowMicros() - start == 15000);
  CHECK(written_at_sleep == std::vector<uint64_t>{0, 4, 8});  // each delay precedes its write
  CHECK(ReadText(*b, 12) == "abcdabcdabcd");
}

TEST_CASE("FrameChannel reports kUnavailable when the fault filter drops the link", "[stream][channel]") {
  auto [a, b] = StreamPair();
  auto client = FrameChannel::Adopt(std::make_unique<FaultFilter>(std::move(a), DropAfter(50)));
  auto server = FrameChannel::Adopt(std::move(b));
  REQUIRE(client.ok());
  REQUIRE(server.ok());
  REQUIRE((*client)->Send(proto::Heartbeat{1, 2}).ok());  // well under 50 bytes
  proto::WriteBatch wb;
  wb.volume_id = 1;
  wb.records.push_back({1, 0, 4096, proto::RecordKind::kData, 5, Bytes(4096, 7)});
  CHECK((*client)->Send(wb).code() == Code::kUnavailable);
  REQUIRE((*server)->Receive(milliseconds(5000)).ok());
  Result<proto::Message> m = (*server)->Receive(milliseconds(5000));
  CHECK(m.status().code() == Code::kUnavailable);
  CHECK((*server)->bytes_received() == 50);
}

TEST_CASE("FrameChannel detects a flipped byte as kCorruption", "[stream][channel]") {
  for (uint64_t offset : {uint64_t(0), uint64_t(proto::kHeaderSize - 1), uint64_t(proto::kHeaderSize + 3)}) {
    auto [a, b] = StreamPair();
    auto client = FrameChannel::Adopt(std::make_unique<FaultFilter>(std::move(a), FlipAt(offset)));
    auto server = FrameChannel::Adopt(std::move(b));
    REQUIRE(client.ok());
    REQUIRE(server.ok());
    REQUIRE((*client)->Send(proto::Heartbeat{123, 456}).ok());
    Result<proto::Message> m = (*server)->Receive(milliseconds(5000));
    CHECK(m.status().code() == Code::kCorruption);
  }
}

TEST_CASE("throttle filter charges exactly the bytes written", "[stream][throttle]") {
  auto [a, b] = StreamPair();
  ManualClock clock;
  ThrottleOptions to;
  to.default_mbps = 8;  // one byte per microsecond
  to.burst_bytes = 4096;
  Throttle throttle(&clock, to);
  const uint64_t start = clock.NowMicros();
  auto client = FrameChannel::Adopt(std::make_unique<ThrottleFilter>(std::move(a), &throttle, ManualSleep(clock)));
  auto server = FrameChannel::Adopt(std::move(b));
  REQUIRE(client.ok());
  REQUIRE(server.ok());
  proto::WriteBatch wb;
  wb.volume_id = 1;
  wb.records.push_back({1, 0, 65536, proto::RecordKind::kData, 5, Bytes(65536, 7)});
  auto sent = std::async(std::launch::async, [&c = *client, &wb] {
    for (int i = 0; i < 4; ++i) {
      Status s = c->Send(wb);
      if (!s.ok()) return s;
    }
    return c->Send(proto::Heartbeat{1, 2});
  });
  for (int i = 0; i < 5; ++i) REQUIRE((*server)->Receive(milliseconds(5000)).ok());
  REQUIRE(sent.get().ok());
  ThrottleState st = throttle.state();
  CHECK(st.reserved_bytes == (*client)->bytes_sent());
  CHECK(st.reserved_bytes == (*server)->bytes_received());
  CHECK(st.waited_micros > 0);
  CHECK(clock.NowMicros() - start == st.waited_micros);  // every wait the throttle asked for was taken
}

TEST_CASE("Shutdown cuts a throttle wait short", "[stream][throttle]") {
  auto [a, b] = StreamPair();
  ManualClock clock;
  ThrottleOptions to;
  to.default_mbps = 0.001;
  to.burst_bytes = 4096;
  Throttle throttle(&clock, to);
  ThrottleFilter f(std::move(a), &throttle);  // real-time waits
  auto writer = std::async(std::launch::async, [&f] { return WriteText(f, std::string(1 << 20, 'x')); });
  f.Shutdown();
  CHECK(writer.get().code() == Code::kAborted);
}

TEST_CASE("FrameChannel over stacked filters on TCP works end to end", "[stream][channel]") {
  TcpListener l;
  auto server_fut = l.AcceptAsync([](tcp::socket s) { return FrameChannel::Adopt(std::move(s)); });
  ManualClock clock;
  ThrottleOptions to;
  to.default_mbps = 80;
  Throttle throttle(&clock, to);
  std::atomic<int> delays{0};
  auto client = Connect("127.0.0.1", l.acceptor.local_endpoint().port(), milliseconds(5000), {},
                        [&](std::unique_ptr<ByteStream> s) -> std::unique_ptr<ByteStream> {
                          s = std::make_unique<ThrottleFilter>(std::move(s), &throttle, ManualSleep(clock));
                          FaultOptions fo;
                          fo.delay = std::chrono::microseconds(100);
                          fo.sleep = [&delays](uint64_t) {
                            ++delays;
                            return true;
                          };
                          return std::make_unique<FaultFilter>(std::move(s), fo);
                        });
  REQUIRE(client.ok());
  auto server = server_fut.get();
  REQUIRE(server.ok());
  CHECK((*client)->peer().rfind("127.0.0.1:", 0) == 0);

  proto::WriteBatch wb;
  wb.volume_id = 9;
  Bytes data(1u << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t((i * 2654435761u) >> 13);
  wb.records.push_back({1, 0, uint32_t(data.size()), proto::RecordKind::kData, 5, data});
  // One thread sends while this one receives, and the server answers meanwhile.
  auto sent = std::async(std::launch::async, [&c = *client, &wb] {
    Status s = c->Send(wb);
    return s.ok() ? c->Send(proto::Heartbeat{3, 4}) : s;
  });
  Result<proto::Message> m = (*server)->Receive(milliseconds(20000));
  REQUIRE(m.ok());
  CHECK(std::get<proto::WriteBatch>(*m).records.at(0).data == data);
  REQUIRE((*server)->Send(proto::Ack{9, 1}).ok());
  Result<proto::Message> ack = (*client)->Receive(milliseconds(5000));
  REQUIRE(ack.ok());
  CHECK(std::get<proto::Ack>(*ack).volume_id == 9);
  REQUIRE((*server)->Receive(milliseconds(5000)).ok());
  REQUIRE(sent.get().ok());
  CHECK(delays == 2);
  CHECK(throttle.state().reserved_bytes == (*client)->bytes_sent());
  CHECK((*client)->bytes_sent() == (*server)->bytes_received());
}

}  // namespace
}  // namespace cdp
