// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include "common/base/clock.h"
#include "common/daemon/metrics.h"
#include "common/env/env.h"
#include "common/http/http_server.h"
#include "loadgen/sweep.h"
#include "loadgen/sweep_run.h"

using namespace cdp;
using namespace cdp::loadgen;

namespace {

// A recorded 10 s window: 40 MB captured, 320 Mbit in, 160 Mbit out, agent
// 1 CPU s, PS 2 s, MT 3 s; MT read 40 MB and wrote 80 MB.
SweepSample Recorded(uint64_t size, bool comp, double ps_cpu_end) {
  SweepSample s;
  s.size_mb = size;
  s.compression = comp;
  s.begin.wall_s = 1000;
  s.end.wall_s = 1010;
  s.begin.agent = {{"cdp_agent_captured_bytes_total", 1e6}, {"process_cpu_seconds_total", 5}};
  s.end.agent = {{"cdp_agent_captured_bytes_total", 41e6}, {"process_cpu_seconds_total", 6}};
  s.begin.ps = {{"cdp_ps_bytes_in_total", 0}, {"cdp_ps_bytes_out_total", 0}, {"process_cpu_seconds_total", 1}};
  s.end.ps = {{"cdp_ps_bytes_in_total", 40e6}, {"cdp_ps_bytes_out_total", 20e6}, {"process_cpu_seconds_total", ps_cpu_end}};
  s.begin.mt = {{"cdp_mt_disk_read_bytes_total", 0}, {"cdp_mt_disk_write_bytes_total", 0}, {"process_cpu_seconds_total", 0}};
  s.end.mt = {{"cdp_mt_disk_read_bytes_total", 40e6}, {"cdp_mt_disk_write_bytes_total", 80e6}, {"process_cpu_seconds_total", 3}};
  return s;
}

}  // namespace

TEST_CASE("Sweep row: the seed's columns from two metrics snapshots", "[sweep]") {
  auto r = ComputeRow(Recorded(10, false, 3), 2000);
  REQUIRE(r.ok());
  CHECK(r->size_mb == 10);
  CHECK(r->seed == 8);
  CHECK(r->pri_wr_MBps == Approx(4.0));
  CHECK(r->ps_in_Mbps == Approx(32.0));
  CHECK(r->ps_out_Mbps == Approx(16.0));
  CHECK(r->agent_mhz == Approx(200));   // 0.1 of a core at 2000 MHz
  CHECK(r->ps_mhz == Approx(400));
  CHECK(r->mt_mhz == Approx(600));
  CHECK(r->mt_rr_MBps == Approx(4.0));
  CHECK(r->mt_wr_MBps == Approx(8.0));
  CHECK(r->agent_s_per_gb == Approx(25));  // 1 s / 0.04 GB
  CHECK(r->ps_s_per_gb == Approx(50));
  CHECK(r->mt_s_per_gb == Approx(75));
}

TEST_CASE("Sweep row: a missing metric is named - bad window or clock refused", "[sweep]") {
  SweepSample s = Recorded(1, false, 3);
  s.end.mt.erase("cdp_mt_disk_write_bytes_total");
  auto r = ComputeRow(s, 2000);
  CHECK(r.status().IsNotFound());
  CHECK(r.status().message() == "mt: metric cdp_mt_disk_write_bytes_total not exported");
  s = Recorded(1, false, 3);
  s.end.wall_s = s.begin.wall_s;
  CHECK(ComputeRow(s, 2000).status().code() == Code::kInvalidArgument);
  CHECK(ComputeRow(Recorded(1, false, 3), 0).status().code() == Code::kInvalidArgument);
}

TEST_CASE("Sweep tables: the seed's columns, comparison tables A-1 and A-2, CSV", "[sweep]") {
  std::vector<SweepRow> off = {*ComputeRow(Recorded(1, false, 3), 2000), *ComputeRow(Recorded(10, false, 3), 2000)};
  std::vector<SweepRow> on = {*ComputeRow(Recorded(1, true, 5), 2000), *ComputeRow(Recorded(10, true, 6), 2000)};
  std::string md = SeedTableMarkdown(off);
  CHECK(md.find("| Mode | Size | Seed | Pri VM Disk WR | PS BW (In) | PS BW (Out) | Pri VM CPU | PS CPU | Disk RR | "
                "Disk WR | CPU |\n") != std::string::npos);
  CHECK(md.find("| 0 | 10 | 8 | 4.000 | 32.000 | 16.000 | 200 | 400 | 4.000 | 8.000 | 600 |\n") != std::string::npos);
  std::string csv = SeedTableCsv(on);
  CHECK(csv == "Mode,Size,Seed,Pri VM Disk WR,PS BW (In),PS BW (Out),Pri VM CPU,PS CPU,Disk RR,Disk WR,CPU\n"
               "0,1,8,4.000,32.000,16.000,200,800,4.000,8.000,600\n"
               "0,10,8,4.000,32.000,16.000,200,1000,4.000,8.000,600\n");
  // PS: 400 -> 800 MHz is +100%, 400 -> 1000 is +150%.
  CHECK(ComparisonCsv(off, on, false) ==
        "PS CPU MHz (Compression Disabled),PS CPU MHz (Compression Enabled),% CPU Cost to Enable Compression on PS\n"
        "400,800,100.00\n400,1000,150.00\n");
  CHECK(ComparisonMarkdown(off, on, true).find("| MT CPU MHz (Compression Disabled) | MT CPU MHz (Compression Enabled) |") == 0);
  CHECK(ComparisonMarkdown(off, on, true).find("| 600 | 600 | 0.00 |") != std::string::npos);
  CHECK(CpuPerGbMarkdown(off).find("| 10 | 4.000 | 25.00 | 50.00 | 75.00 |") != std::string::npos);
}

TEST_CASE("Sweep charts: SVG with a polyline per series and the axis labels", "[sweep]") {
  std::vector<SweepRow> rows = {*ComputeRow(Recorded(1, false, 3), 2000), *ComputeRow(Recorded(10, false, 4), 2000)};
  rows[1].pri_wr_MBps = 7;
  std::string cpu = CpuChartSvg(rows, "CPU vs write rate");
  CHECK(cpu.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(cpu.find("</svg>") != std::string::npos);
  size_t lines = 0;
  for (size_t p = cpu.find("<polyline"); p != std::string::npos; p = cpu.find("<polyline", p + 1)) ++lines;
  CHECK(lines == 3);
  CHECK(cpu.find("Primary VM disk write rate (MB/s)") != std::string::npos);
  CHECK(cpu.find("CPU (MHz)") != std::string::npos);
  CHECK(cpu.find(">Master target<") != std::string::npos);
  std::string bw = BandwidthChartSvg(rows, "Bandwidth & rate <test>");
  CHECK(bw.find("Bandwidth &amp; rate &lt;test&gt;") != std::string::npos);
  CHECK(bw.find(">PS BW (Out)<") != std::string::npos);
}

TEST_CASE("Sweep samples JSON round trip", "[sweep]") {
  std::vector<SweepSample> in = {Recorded(1, false, 3), Recorded(250, true, 9)};
  auto j = SamplesToJson(in, 2400);
  double mhz = 0;
  auto out = SamplesFromJson(boost::json::parse(boost::json::serialize(j)), &mhz);
  REQUIRE(out.ok());
  CHECK(mhz == 2400);
  REQUIRE(out->size() == 2);
  CHECK((*out)[1].size_mb == 250);
  CHECK((*out)[1].compression);
  CHECK((*out)[1].end.ps.at("process_cpu_seconds_total") == 9);
  CHECK((*out)[0].begin.wall_s == 1000);
  CHECK(SamplesFromJson(boost::json::parse("{\"version\":2}"), &mhz).status().code() == Code::kInvalidArgument);
}

TEST_CASE("Core clock from a cpuinfo file", "[sweep]") {
  auto env = NewMemEnv();
  std::string text = "processor\t: 0\ncpu MHz\t\t: 2000.000\n\nprocessor\t: 1\ncpu MHz\t\t: 3000.000\n";
  REQUIRE(WriteFileAtomic(env.get(), "/cpuinfo", ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size())).ok());
  auto m = CoreMhzFromCpuinfo(env.get(), "/cpuinfo");
  REQUIRE(m.ok());
  CHECK(*m == 2500);
  REQUIRE(WriteFileAtomic(env.get(), "/none", ByteSpan()).ok());
  CHECK(CoreMhzFromCpuinfo(env.get(), "/none").status().IsNotFound());
}

#include <sstream>

#include "loadgen/tests/test_util.h"

namespace {

std::vector<std::vector<std::string>> ReadCsv(const std::string& path) {
  auto b = ReadWholeFile(DefaultEnv(), path);
  std::vector<std::vector<std::string>> rows;
  if (!b.ok()) return rows;
  std::istringstream in(std::string(b->begin(), b->end()));
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    std::string c;
    while (std::getline(ls, c, ',')) cells.push_back(c);
    rows.push_back(cells);
  }
  return rows;
}

}  // namespace

TEST_CASE("regression: a process server that has not exported its backlog yet is not drained", "[sweep]") {
  // The sweep under ASan began a sample before the agent had opened its
  // volume at the PS: "drained" then, the sample lacked cdp_ps_bytes_in_total.
  metrics::Registry agent, ps, mt;
  agent.AddComputed("cdp_agent_queue_bytes", "Queued", metrics::Type::kGauge, [] { return 0.0; });
  std::vector<std::unique_ptr<http::Server>> servers;
  SweepTargets t;
  for (auto [reg, url] : {std::pair{&agent, &t.agent_metrics}, {&ps, &t.ps_metrics}, {&mt, &t.mt_metrics}}) {
    http::ServerOptions so;
    so.registry = reg;
    servers.push_back(std::make_unique<http::Server>(so));
    REQUIRE(servers.back()->Start().ok());
    *url = "http://127.0.0.1:" + std::to_string(servers.back()->port()) + "/metrics";
  }
  Status s = WaitDrained(t, 300'000, SystemClock::Get());
  CHECK(s.IsBusy());
  CHECK(s.message().find("cdp_ps_backlog_bytes not exported") != std::string::npos);
  ps.AddComputed("cdp_ps_backlog_bytes", "Backlog", metrics::Type::kGauge, [] { return 0.0; });
  CHECK(WaitDrained(t, 10'000'000, SystemClock::Get()).ok());
  for (auto& srv : servers) srv->Stop();
}

TEST_CASE("cdp-loadgen sweep --local: real daemons, both phases, every column present and non-negative",
          "[sweep][e2e]") {
  cdp::testing::ScratchDir tmp;
  const std::string out = tmp.path() + "/out";
  auto r = RunShell(std::string(CDP_LOADGEN_BIN) + " sweep --local " + CDP_BUILD_DIR +
                        " --sizes 1,4 --window 2s --pause 200ms --drain-timeout 60s --volume-size 256MiB --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<std::string> cols = {"Mode", "Size", "Seed", "Pri VM Disk WR", "PS BW (In)", "PS BW (Out)",
                                         "Pri VM CPU", "PS CPU", "Disk RR", "Disk WR", "CPU"};
  for (const char* phase : {"off", "on"}) {
    auto rows = ReadCsv(out + "/compression_" + std::string(phase) + ".csv");
    REQUIRE(rows.size() == 3);
    CHECK(rows[0] == cols);
    for (size_t i = 1; i < rows.size(); ++i) {
      REQUIRE(rows[i].size() == cols.size());
      CHECK(rows[i][0] == "0");
      CHECK(rows[i][1] == (i == 1 ? "1" : "4"));
      CHECK(rows[i][2] == "8");
      for (size_t c = 3; c < cols.size(); ++c) {
        INFO(phase << " row " << i << " column " << cols[c] << " = " << rows[i][c]);
        CHECK(std::stod(rows[i][c]) >= 0);
      }
      CHECK(std::stod(rows[i][3]) > 0);  // the tree loop wrote through the agent
      CHECK(std::stod(rows[i][4]) > 0);  // and the process server received it
    }
    CHECK(RunShell("test -s " + out + "/cpu_" + phase + ".svg").exit_code == 0);
    CHECK(RunShell("test -s " + out + "/bandwidth_" + phase + ".svg").exit_code == 0);
  }
  for (const char* t : {"table_a1_ps.csv", "table_a2_mt.csv"}) {
    auto rows = ReadCsv(out + "/" + t);
    CHECK(rows.size() == 3);
  }
  // The recorded samples re-render to the same tables.
  auto again = RunShell(std::string(CDP_LOADGEN_BIN) + " sweep --from " + out + "/samples.json --out " + out + "/re");
  REQUIRE(again.exit_code == 0);
  CHECK(ReadCsv(out + "/re/compression_on.csv") == ReadCsv(out + "/compression_on.csv"));
}
