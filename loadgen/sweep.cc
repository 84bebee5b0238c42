// SPDX-License-Identifier: Apache-2.0
#include "loadgen/sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <boost/json.hpp>

namespace cdp::loadgen {
namespace {

Result<double> Delta(const DaemonSnapshot& b, const DaemonSnapshot& e, const MetricSums DaemonSnapshot::*which,
                     const char* daemon, const char* metric) {
  auto ib = (b.*which).find(metric);
  auto ie = (e.*which).find(metric);
  if (ib == (b.*which).end() || ie == (e.*which).end())
    return Status::NotFound(std::string(daemon) + ": metric " + metric + " not exported");
  double d = ie->second - ib->second;
  if (!std::isfinite(d)) return Status::NotFound(std::string(daemon) + ": metric " + metric + " is not a number");
  return d < 0 ? ie->second : d;  // a restarted daemon counts from zero again
}

std::string Num(double v, int prec) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", prec, v);
  return buf;
}

}  // namespace

Result<SweepRow> ComputeRow(const SweepSample& s, double core_mhz) {
  const double t = s.end.wall_s - s.begin.wall_s;
  if (!(t > 0)) return Status::InvalidArgument("sweep sample window must be > 0 s");
  if (!(core_mhz > 0)) return Status::InvalidArgument("core clock must be > 0 MHz");
  SweepRow r;
  r.mode = s.mode;
  r.size_mb = s.size_mb;
  r.seed = s.seed;
  r.compression = s.compression;
  const auto& b = s.begin;
  const auto& e = s.end;
  CDP_ASSIGN_OR_RETURN(double cap, Delta(b, e, &DaemonSnapshot::agent, "agent", "cdp_agent_captured_bytes_total"));
  CDP_ASSIGN_OR_RETURN(double in, Delta(b, e, &DaemonSnapshot::ps, "ps", "cdp_ps_bytes_in_total"));
  CDP_ASSIGN_OR_RETURN(double out, Delta(b, e, &DaemonSnapshot::ps, "ps", "cdp_ps_bytes_out_total"));
  CDP_ASSIGN_OR_RETURN(double acpu, Delta(b, e, &DaemonSnapshot::agent, "agent", "process_cpu_seconds_total"));
  CDP_ASSIGN_OR_RETURN(double pcpu, Delta(b, e, &DaemonSnapshot::ps, "ps", "process_cpu_seconds_total"));
  CDP_ASSIGN_OR_RETURN(double mcpu, Delta(b, e, &DaemonSnapshot::mt, "mt", "process_cpu_seconds_total"));
  CDP_ASSIGN_OR_RETURN(double rd, Delta(b, e, &DaemonSnapshot::mt, "mt", "cdp_mt_disk_read_bytes_total"));
  CDP_ASSIGN_OR_RETURN(double wr, Delta(b, e, &DaemonSnapshot::mt, "mt", "cdp_mt_disk_write_bytes_total"));
  r.pri_wr_MBps = cap / t / 1e6;
  r.ps_in_Mbps = in * 8 / t / 1e6;
  r.ps_out_Mbps = out * 8 / t / 1e6;
  r.agent_mhz = acpu / t * core_mhz;
  r.ps_mhz = pcpu / t * core_mhz;
  r.mt_mhz = mcpu / t * core_mhz;
  r.mt_rr_MBps = rd / t / 1e6;
  r.mt_wr_MBps = wr / t / 1e6;
  if (cap > 0) {
    r.agent_s_per_gb = acpu / (cap / 1e9);
    r.ps_s_per_gb = pcpu / (cap / 1e9);
    r.mt_s_per_gb = mcpu / (cap / 1e9);
  }
  return r;
}

Result<double> CoreMhzFromCpuinfo(Env* env, const std::string& path) {
  OpenOptions oo;
  oo.read_only = true;
  CDP_ASSIGN_OR_RETURN(auto f, env->Open(path, oo));
  std::string text;
  uint8_t buf[65536];
  for (uint64_t off = 0; text.size() < (4u << 20);) {
    CDP_ASSIGN_OR_RETURN(size_t n, f->ReadUpTo(off, sizeof(buf), buf));
    if (n == 0) break;
    text.append(reinterpret_cast<char*>(buf), n);
    off += n;
  }
  double sum = 0;
  int count = 0;
  size_t pos = 0;
  while ((pos = text.find("cpu MHz", pos)) != std::string::npos) {
    size_t colon = text.find(':', pos);
    if (colon == std::string::npos) break;
    double v = std::strtod(text.c_str() + colon + 1, nullptr);
    if (v > 0) {
      sum += v;
      ++count;
    }
    pos = colon;
  }
  if (count == 0) return Status::NotFound(path + ": no 'cpu MHz' line; give --core-mhz");
  return sum / count;
}

namespace {

const char* kSeedCols[] = {"Mode", "Size", "Seed", "Pri VM Disk WR", "PS BW (In)", "PS BW (Out)",
                           "Pri VM CPU", "PS CPU", "Disk RR", "Disk WR", "CPU"};

std::vector<std::string> SeedCells(const SweepRow& r) {
  return {std::to_string(r.mode), std::to_string(r.size_mb), std::to_string(r.seed), Num(r.pri_wr_MBps, 3),
          Num(r.ps_in_Mbps, 3), Num(r.ps_out_Mbps, 3), Num(r.agent_mhz, 0), Num(r.ps_mhz, 0),
          Num(r.mt_rr_MBps, 3), Num(r.mt_wr_MBps, 3), Num(r.mt_mhz, 0)};
}

std::string MdRow(const std::vector<std::string>& cells) {
  std::string s = "|";
  for (const auto& c : cells) s += " " + c + " |";
  return s + "\n";
}

std::string CsvRow(const std::vector<std::string>& cells) {
  std::string s;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i) s += ',';
    s += cells[i];
  }
  return s + "\n";
}

double CostPct(double off, double on) { return off > 0 ? (on - off) / off * 100 : 0; }

std::vector<std::vector<std::string>> ComparisonCells(const std::vector<SweepRow>& off, const std::vector<SweepRow>& on,
                                                      bool mt) {
  std::map<uint64_t, const SweepRow*> by_size;
  for (const auto& r : on) by_size[r.size_mb] = &r;
  std::vector<std::vector<std::string>> out;
  for (const auto& a : off) {
    auto it = by_size.find(a.size_mb);
    if (it == by_size.end()) continue;
    double x = mt ? a.mt_mhz : a.ps_mhz, y = mt ? it->second->mt_mhz : it->second->ps_mhz;
    out.push_back({Num(x, 0), Num(y, 0), Num(CostPct(x, y), 2)});
  }
  return out;
}

std::vector<std::string> ComparisonHeader(bool mt) {
  std::string who = mt ? "MT" : "PS";
  // The seed's Table A-2 says "on PS" in its last column too; kept verbatim.
  return {who + " CPU MHz (Compression Disabled)", who + " CPU MHz (Compression Enabled)",
          "% CPU Cost to Enable Compression on PS"};
}

}  // namespace

std::string SeedTableMarkdown(const std::vector<SweepRow>& rows) {
  std::string s =
      "GenerateTestTree Params: Mode, Size (MB), Seed. Enterprise (Primary VM, PS): Pri VM Disk WR (MB/s), "
      "PS BW (In), PS BW (Out) (Mbit/s), Pri VM CPU, PS CPU (MHz). Service Provider (MT): Disk RR, Disk WR (MB/s), "
      "CPU (MHz).\n\n";
  s += MdRow(std::vector<std::string>(std::begin(kSeedCols), std::end(kSeedCols)));
  s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& r : rows) s += MdRow(SeedCells(r));
  return s;
}

std::string SeedTableCsv(const std::vector<SweepRow>& rows) {
  std::string s = CsvRow(std::vector<std::string>(std::begin(kSeedCols), std::end(kSeedCols)));
  for (const auto& r : rows) s += CsvRow(SeedCells(r));
  return s;
}

std::string CpuPerGbMarkdown(const std::vector<SweepRow>& rows) {
  std::string s = "| Size | Pri VM Disk WR | Agent CPU s/GB | PS CPU s/GB | MT CPU s/GB |\n|---:|---:|---:|---:|---:|\n";
  for (const auto& r : rows)
    s += MdRow({std::to_string(r.size_mb), Num(r.pri_wr_MBps, 3), Num(r.agent_s_per_gb, 2), Num(r.ps_s_per_gb, 2),
                Num(r.mt_s_per_gb, 2)});
  return s;
}

std::string ComparisonMarkdown(const std::vector<SweepRow>& off, const std::vector<SweepRow>& on, bool mt) {
  std::string s = MdRow(ComparisonHeader(mt)) + "|---:|---:|---:|\n";
  for (const auto& c : ComparisonCells(off, on, mt)) s += MdRow(c);
  return s;
}

std::string ComparisonCsv(const std::vector<SweepRow>& off, const std::vector<SweepRow>& on, bool mt) {
  std::string s = CsvRow(ComparisonHeader(mt));
  for (const auto& c : ComparisonCells(off, on, mt)) s += CsvRow(c);
  return s;
}

namespace {

// A "nice" tick step (1, 2 or 5 x 10^k) giving about `n` ticks over [0, hi].
double NiceStep(double hi, int n) {
  if (!(hi > 0)) return 1;
  double raw = hi / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

std::string Esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string Fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

std::string LineChartSvg(const std::string& title, const std::string& xl, const std::string& yl,
                         const std::vector<ChartSeries>& series) {
  const double W = 720, H = 440, L = 80, R = 170, T = 50, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  double xmax = 0, ymax = 0;
  for (const auto& s : series) {
    for (double x : s.x) xmax = std::max(xmax, x);
    for (double y : s.y) ymax = std::max(ymax, y);
  }
  double xs = NiceStep(xmax, 8), ys = NiceStep(ymax, 8);
  double xtop = std::max(xs, std::ceil(xmax / xs) * xs), ytop = std::max(ys, std::ceil(ymax / ys) * ys);
  auto X = [&](double x) { return L + x / xtop * pw; };
  auto Y = [&](double y) { return T + ph - y / ytop * ph; };
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" viewBox=\"0 0 %g %g\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                W, H, W, H);
  s += buf;
  std::snprintf(buf, sizeof(buf), "<text x=\"%g\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n",
                L + pw / 2, Esc(title).c_str());
  s += buf;
  for (double x = 0; x <= xtop + xs / 2; x += xs) {
    std::snprintf(buf, sizeof(buf),
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                  X(x), T, X(x), T + ph, X(x), T + ph + 18, Fmt(x).c_str());
    s += buf;
  }
  for (double y = 0; y <= ytop + ys / 2; y += ys) {
    std::snprintf(buf, sizeof(buf),
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                  L, Y(y), L + pw, Y(y), L - 6, Y(y) + 4, Fmt(y).c_str());
    s += buf;
  }
  std::snprintf(buf, sizeof(buf),
                "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>"
                "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n",
                L, T + ph, L + pw, T + ph, L, T, L, T + ph);
  s += buf;
  std::snprintf(buf, sizeof(buf), "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", L + pw / 2, H - 15,
                Esc(xl).c_str());
  s += buf;
  std::snprintf(buf, sizeof(buf),
                "<text x=\"20\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 20 %g)\">%s</text>\n",
                T + ph / 2, T + ph / 2, Esc(yl).c_str());
  s += buf;
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& ser = series[i];
    const char* col = kColors[i % 6];
    // Points in x order so the line reads left to right.
    std::vector<std::pair<double, double>> pts;
    for (size_t k = 0; k < std::min(ser.x.size(), ser.y.size()); ++k) pts.push_back({ser.x[k], ser.y[k]});
    std::sort(pts.begin(), pts.end());
    std::string poly;
    for (auto [x, y] : pts) {
      std::snprintf(buf, sizeof(buf), "%.1f,%.1f ", X(x), Y(y));
      poly += buf;
    }
    s += "<polyline fill=\"none\" stroke=\"" + std::string(col) + "\" stroke-width=\"2\" points=\"" + poly + "\"/>\n";
    for (auto [x, y] : pts) {
      std::snprintf(buf, sizeof(buf), "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", X(x), Y(y), col);
      s += buf;
    }
    double ly = T + 10 + 22 * double(i);
    std::snprintf(buf, sizeof(buf),
                  "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"2\"/>"
                  "<text x=\"%g\" y=\"%g\">%s</text>\n",
                  L + pw + 15, ly, L + pw + 40, ly, col, L + pw + 46, ly + 4, Esc(ser.name).c_str());
    s += buf;
  }
  s += "</svg>\n";
  return s;
}

std::string CpuChartSvg(const std::vector<SweepRow>& rows, const std::string& title) {
  ChartSeries a{"Primary VM (agent)", {}, {}}, p{"Process server", {}, {}}, m{"Master target", {}, {}};
  for (const auto& r : rows) {
    for (auto* s : {&a, &p, &m}) s->x.push_back(r.pri_wr_MBps);
    a.y.push_back(r.agent_mhz);
    p.y.push_back(r.ps_mhz);
    m.y.push_back(r.mt_mhz);
  }
  return LineChartSvg(title, "Primary VM disk write rate (MB/s)", "CPU (MHz)", {a, p, m});
}

std::string BandwidthChartSvg(const std::vector<SweepRow>& rows, const std::string& title) {
  ChartSeries in{"PS BW (In)", {}, {}}, out{"PS BW (Out)", {}, {}};
  for (const auto& r : rows) {
    in.x.push_back(r.pri_wr_MBps);
    out.x.push_back(r.pri_wr_MBps);
    in.y.push_back(r.ps_in_Mbps);
    out.y.push_back(r.ps_out_Mbps);
  }
  return LineChartSvg(title, "Primary VM disk write rate (MB/s)", "Bandwidth (Mbit/s)", {in, out});
}

namespace {

boost::json::object SumsToJson(const MetricSums& m) {
  boost::json::object o;
  for (const auto& [k, v] : m)
    if (std::isfinite(v)) o[k] = v;
  return o;
}

boost::json::object SnapToJson(const DaemonSnapshot& s) {
  return {{"wall_s", s.wall_s}, {"agent", SumsToJson(s.agent)}, {"ps", SumsToJson(s.ps)}, {"mt", SumsToJson(s.mt)}};
}

Status NumberAt(const boost::json::object& o, const char* key, double* out) {
  auto* v = o.if_contains(key);
  if (!v || !(v->is_number())) return Status::InvalidArgument(std::string("sweep samples: missing number '") + key + "'");
  *out = v->to_number<double>();
  return Status::OK();
}

Status SumsFromJson(const boost::json::value* v, const char* what, MetricSums* out) {
  if (!v || !v->is_object()) return Status::InvalidArgument(std::string("sweep samples: missing object '") + what + "'");
  for (const auto& [k, x] : v->as_object()) {
    if (!x.is_number()) return Status::InvalidArgument("sweep samples: non-numeric metric " + std::string(k));
    (*out)[std::string(k)] = x.to_number<double>();
  }
  return Status::OK();
}

Status SnapFromJson(const boost::json::value* v, DaemonSnapshot* s) {
  if (!v || !v->is_object()) return Status::InvalidArgument("sweep samples: missing snapshot");
  const auto& o = v->as_object();
  CDP_RETURN_IF_ERROR(NumberAt(o, "wall_s", &s->wall_s));
  CDP_RETURN_IF_ERROR(SumsFromJson(o.if_contains("agent"), "agent", &s->agent));
  CDP_RETURN_IF_ERROR(SumsFromJson(o.if_contains("ps"), "ps", &s->ps));
  return SumsFromJson(o.if_contains("mt"), "mt", &s->mt);
}

}  // namespace

boost::json::value SamplesToJson(const std::vector<SweepSample>& samples, double core_mhz) {
  boost::json::array arr;
  for (const auto& s : samples)
    arr.push_back(boost::json::object{{"mode", s.mode},
                                      {"size_mb", s.size_mb},
                                      {"seed", s.seed},
                                      {"compression", s.compression},
                                      {"begin", SnapToJson(s.begin)},
                                      {"end", SnapToJson(s.end)}});
  return boost::json::object{{"version", 1}, {"core_mhz", core_mhz}, {"samples", arr}};
}

Result<std::vector<SweepSample>> SamplesFromJson(const boost::json::value& v, double* core_mhz) {
  if (!v.is_object()) return Status::InvalidArgument("sweep samples: not a JSON object");
  const auto& o = v.as_object();
  double version = 0;
  CDP_RETURN_IF_ERROR(NumberAt(o, "version", &version));
  if (version != 1) return Status::InvalidArgument("sweep samples: unsupported version");
  CDP_RETURN_IF_ERROR(NumberAt(o, "core_mhz", core_mhz));
  auto* arr = o.if_contains("samples");
  if (!arr || !arr->is_array()) return Status::InvalidArgument("sweep samples: missing 'samples' array");
  std::vector<SweepSample> out;
  for (const auto& e : arr->as_array()) {
    if (!e.is_object()) return Status::InvalidArgument("sweep samples: a sample is not an object");
    const auto& so = e.as_object();
    SweepSample s;
    double mode = 0, size = 0, seed = 0;
    CDP_RETURN_IF_ERROR(NumberAt(so, "mode", &mode));
    CDP_RETURN_IF_ERROR(NumberAt(so, "size_mb", &size));
    CDP_RETURN_IF_ERROR(NumberAt(so, "seed", &seed));
    auto* c = so.if_contains("compression");
    if (!c || !c->is_bool()) return Status::InvalidArgument("sweep samples: missing bool 'compression'");
    s.mode = uint32_t(mode);
    s.size_mb = uint64_t(size);
    s.seed = uint64_t(seed);
    s.compression = c->as_bool();
    CDP_RETURN_IF_ERROR(SnapFromJson(so.if_contains("begin"), &s.begin));
    CDP_RETURN_IF_ERROR(SnapFromJson(so.if_contains("end"), &s.end));
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace cdp::loadgen
