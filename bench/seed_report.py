#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""seed_report.py: the tables and charts of bench/seed_bench.sh.

Reads OUT_DIR/{control,chunks,seq,connect}.csv, writes OUT_DIR/*.svg (plain SVG
drawn here: no matplotlib, no network) and prints the Markdown for
docs/benchmarks.md to stdout.

usage: seed_report.py OUT_DIR [--volume-mb N] [--points N] [--quick 0|1]
                      [--elapsed S] [--runs N] [--wan-api-runs N]
"""
import argparse
import csv
import math
import os
import sys

LINKS = {"loopback": "loopback", "wan": "25 ms RTT"}
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]


def read(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def size_name(b):
    b = int(b)
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return "%d %s" % (b // n, unit)
    return "%d B" % b


def ms(us):
    v = float(us) / 1000.0
    if v >= 100:
        return "%.0f" % v
    if v >= 10:
        return "%.1f" % v
    return "%.2f" % v if v >= 0.1 else "%.3f" % v


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def line_chart(path, title, xlabel, ylabel, series, xlog2=True, ylog=True, xfmt=str):
    """series: [(name, [(x, y), ...])]; log2 x, log10 y."""
    W, H, L, R, T, B = 760, 440, 70, 230, 30, 50
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts if y > 0]
    if not xs or not ys:
        return
    fx = (lambda v: math.log2(v)) if xlog2 else (lambda v: v)
    x0, x1 = fx(min(xs)), fx(max(xs))
    if x1 == x0:
        x1 = x0 + 1
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    if y1 == y0:
        y1 = y0 + 1

    def px(v):
        return L + (W - L - R) * (fx(v) - x0) / (x1 - x0)

    def py(v):
        v = max(v, 10 ** y0)
        return T + (H - T - B) * (y1 - math.log10(v)) / (y1 - y0)

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="14">%s</text>' % (L, esc(title))]
    for d in range(y0, y1 + 1):
        y = py(10 ** d)
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, y, W - R, y))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 5, y + 4, 10 ** d))
    for x in sorted(set(xs)):
        xx = px(x)
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>' % (xx, T, xx, H - B))
        out.append('<text x="%.1f" y="%d" text-anchor="middle" font-size="10">%s</text>' % (xx, H - B + 14, esc(xfmt(x))))
    out.append('<text x="%d" y="%d" text-anchor="middle">%s</text>' % ((W - R + L) // 2, H - 12, esc(xlabel)))
    out.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">%s</text>' %
               ((H - B + T) // 2, (H - B + T) // 2, esc(ylabel)))
    servers = []  # one colour per server; plain TCP dashed
    for name, _ in series:
        if name.rsplit(", ", 1)[0] not in servers:
            servers.append(name.rsplit(", ", 1)[0])
    for i, (name, pts) in enumerate(series):
        c = COLOURS[servers.index(name.rsplit(", ", 1)[0]) % len(COLOURS)]
        dash = ' stroke-dasharray="5,3"' if "plain" in name else ""
        pl = " ".join("%.1f,%.1f" % (px(x), py(y)) for x, y in sorted(pts) if y > 0)
        out.append('<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>' % (c, dash, pl))
        for x, y in pts:
            if y > 0:
                out.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (px(x), py(y), c))
        ly = T + 10 + 18 * i
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' % (W - R + 10, ly, W - R + 30, ly, c, dash))
        out.append('<text x="%d" y="%d" font-size="11">%s</text>' % (W - R + 35, ly + 4, esc(name)))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def bar_chart(path, title, groups, names, values):
    """Horizontal log-scale bars: for each group (operation), one bar per name."""
    vals = [v for row in values for v in row if v > 0]
    if not vals:
        return
    W, L, R, T = 760, 90, 40, 40
    bar, gap = 12, 14
    H = T + len(groups) * (bar * len(names) + gap) + 50 + 18 * len(names)
    y0, y1 = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    if y1 == y0:
        y1 += 1

    def px(v):
        return L + (W - L - R) * (math.log10(max(v, 10 ** y0)) - y0) / (y1 - y0)

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="14">%s</text>' % (L, esc(title))]
    bottom = T + len(groups) * (bar * len(names) + gap)
    for d in range(y0, y1 + 1):
        x = px(10 ** d)
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (x, T - 5, x, bottom))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%g ms</text>' % (x, bottom + 14, 10 ** d))
    y = T
    for gi, g in enumerate(groups):
        out.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (L - 6, y + bar * len(names) / 2 + 4, esc(g)))
        for ni in range(len(names)):
            v = values[gi][ni]
            if v > 0:
                out.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>' %
                           (L, y, px(v) - L, bar - 2, COLOURS[ni % len(COLOURS)]))
            y += bar
        y += gap
    for ni, n in enumerate(names):
        ly = bottom + 32 + 18 * ni
        out.append('<rect x="%d" y="%d" width="14" height="10" fill="%s"/>' % (L, ly - 9, COLOURS[ni % len(COLOURS)]))
        out.append('<text x="%d" y="%d">%s</text>' % (L + 20, ly, esc(n)))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--volume-mb", default="?")
    ap.add_argument("--points", default="?")
    ap.add_argument("--quick", default="0")
    ap.add_argument("--elapsed", default="?")
    ap.add_argument("--runs", default="1000")
    ap.add_argument("--wan-api-runs", default="?")
    a = ap.parse_args()
    out = a.out
    rel = os.path.relpath(out, "docs") if out.startswith("docs") else out
    p = print
    if a.quick == "1":
        p("> SMOKE RUN (QUICK=1): tiny sizes and run counts; these figures are not measurements.\n")
    p("Whole run: %s s.\n" % a.elapsed)

    # ---- Control operations (Ringer's table) ----
    control = read(os.path.join(out, "control.csv"))
    if control:
        ops = [o for o in ("status", "points", "export", "unexport", "tag") if any(r["op"] == o for r in control)]
        cols = [(l, m) for l in ("loopback", "wan") for m in ("api", "cdpctl")
                if any(r["link"] == l and r["method"] == m for r in control)]
        idx = {(r["link"], r["method"], r["op"]): r for r in control}
        p("**Control operations**: mean / p99 latency in ms (runs per cell in brackets). "
          "api: the HTTP requests cdpctl makes, from one process (a new TCP connection per request, as cdpctl); "
          "cdpctl: the process end to end. status = GET /status of the agent, the process server and the master "
          "target in turn; tag goes to the agent, the others to the master target. %s recovery points at the end "
          "(points answers with all of them).\n" % a.points)
        p("| operation | " + " | ".join("%s %s" % (LINKS[l], m) for l, m in cols) + " |")
        p("|---|" + "---:|" * len(cols))
        for o in ops:
            cells = []
            for l, m in cols:
                r = idx.get((l, m, o))
                cells.append("%s / %s (%s)" % (ms(r["mean_us"]), ms(r["p99_us"]), r["runs"]) if r else "")
            p("| %s | %s |" % (o, " | ".join(cells)))
        p("")
        names = ["%s %s" % (LINKS[l], m) for l, m in cols]
        values = [[float(idx[(l, m, o)]["mean_us"]) / 1000 if (l, m, o) in idx else 0 for l, m in cols] for o in ops]
        bar_chart(os.path.join(out, "control.svg"), "Control operations: mean latency (ms, log scale)", ops, names, values)
        p("![control operations](%s/control.svg)\n" % rel)

    # ---- Export reads by chunk size (LoRS Tables 5/6) ----
    chunks = read(os.path.join(out, "chunks.csv"))
    for link in ("loopback", "wan"):
        rows = [r for r in chunks if r["link"] == link]
        if not rows:
            continue
        servers = []
        for r in rows:
            k = (r["server"], r["transport"])
            if k not in servers:
                servers.append(k)
        idx = {(r["server"], r["transport"], int(r["chunk"])): r for r in rows}
        sizes = sorted({int(r["chunk"]) for r in rows})
        for tr in ("tls", "plain"):
            ss = [s for s in servers if s[1] == tr]
            if not ss:
                continue
            reads = sorted({r["reads"] for r in rows if r["transport"] == tr}, key=int)
            p("**Export reads, %s, %s** (one connection, one read in flight, sequential; %s reads per chunk size): "
              "MB/s (10^6 bytes) and the mean duration of one read call in ms. "
              "vs nbdkit: the export's mean read time over nbdkit's; over 1.20 is flagged **bold**.\n"
              % (LINKS[link], "NBD over TLS 1.3" if tr == "tls" else "plain TCP", "/".join(reads)))
            hdr = ["chunk"]
            for s in ss:
                hdr += ["%s MB/s" % s[0], "%s read ms" % s[0]]
            kit = next((s for s in ss if s[0].startswith("nbdkit")), None)
            ours = [s for s in ss if not s[0].startswith("nbdkit")]
            if kit:
                hdr += ["%s / nbdkit time" % s[0] for s in ours]
            p("| " + " | ".join(hdr) + " |")
            p("|---|" + "---:|" * (len(hdr) - 1))
            for c in sizes:
                cells = [size_name(c)]
                for s in ss:
                    r = idx.get((s[0], s[1], c))
                    cells += ([("%.2f" % float(r["mb_per_s"])), ms(r["mean_us"])] if r else ["", ""])
                if kit:
                    for s in ours:
                        r, k = idx.get((s[0], s[1], c)), idx.get((kit[0], kit[1], c))
                        if r and k and float(k["mean_us"]) > 0:
                            x = float(r["mean_us"]) / float(k["mean_us"])
                            cells.append(("**%.2f**" if x > 1.2 else "%.2f") % x)
                        else:
                            cells.append("")
                p("| " + " | ".join(cells) + " |")
            p("")
        series_t = [("%s, %s" % s, [(int(r["chunk"]), float(r["mb_per_s"])) for r in rows if (r["server"], r["transport"]) == s])
                    for s in servers]
        series_l = [("%s, %s" % s, [(int(r["chunk"]), float(r["mean_us"]) / 1000) for r in rows if (r["server"], r["transport"]) == s])
                    for s in servers]
        line_chart(os.path.join(out, "throughput-%s.svg" % link), "Export read throughput by chunk size, %s" % LINKS[link],
                   "chunk size", "MB/s", series_t, xfmt=size_name)
        line_chart(os.path.join(out, "latency-%s.svg" % link), "Single read duration by chunk size, %s" % LINKS[link],
                   "chunk size", "ms per read", series_l, xfmt=size_name)
        p("![throughput, %s](%s/throughput-%s.svg) ![latency, %s](%s/latency-%s.svg)\n" % (LINKS[link], rel, link, LINKS[link], rel, link))

    # ---- Sequential 2^n bytes (Ringer's figure) ----
    seq = read(os.path.join(out, "seq.csv"))
    for link in ("loopback", "wan"):
        rows = [r for r in seq if r["link"] == link]
        if not rows:
            continue
        servers = []
        for r in rows:
            k = (r["server"], r["transport"])
            if k not in servers:
                servers.append(k)
        idx = {(r["server"], r["transport"], int(r["n"])): r for r in rows}
        ns = sorted({int(r["n"]) for r in rows})
        runs = sorted({r["runs"] for r in rows}, key=int)
        p("**Time to read 2^n bytes sequentially, %s** (requests of at most 128 KiB, one in flight; mean of %s runs, "
          "each from a different offset), ms:\n" % (LINKS[link], "/".join(runs)))
        p("| n | bytes | " + " | ".join("%s, %s" % s for s in servers) + " |")
        p("|---:|---:|" + "---:|" * len(servers))
        for n in ns:
            p("| %d | %s | %s |" % (n, size_name(1 << n), " | ".join(
                ms(idx[(s[0], s[1], n)]["mean_us"]) if (s[0], s[1], n) in idx else "" for s in servers)))
        p("")
        series = [("%s, %s" % s, [(1 << int(r["n"]), float(r["mean_us"]) / 1000) for r in rows if (r["server"], r["transport"]) == s])
                  for s in servers]
        line_chart(os.path.join(out, "seq-%s.svg" % link), "Time to read 2^n bytes sequentially, %s" % LINKS[link],
                   "bytes read", "ms", series, xfmt=lambda x: str(int(math.log2(x))))
        p("![sequential reads, %s](%s/seq-%s.svg)\n" % (LINKS[link], rel, link))

    # ---- Connect ----
    conn = read(os.path.join(out, "connect.csv"))
    if conn:
        p("**Connect** (TCP connect, STARTTLS and TLS handshake when TLS, NBD_OPT_GO; then NBD_CMD_DISC), mean / p99 ms:\n")
        p("| server | transport | " + " | ".join(LINKS[l] for l in ("loopback", "wan") if any(r["link"] == l for r in conn)) + " |")
        links = [l for l in ("loopback", "wan") if any(r["link"] == l for r in conn)]
        p("|---|---|" + "---:|" * len(links))
        servers = []
        for r in conn:
            k = (r["server"], r["transport"])
            if k not in servers:
                servers.append(k)
        idx = {(r["link"], r["server"], r["transport"]): r for r in conn}
        for s in servers:
            cells = []
            for l in links:
                r = idx.get((l, s[0], s[1]))
                cells.append("%s / %s" % (ms(r["mean_us"]), ms(r["p99_us"])) if r else "")
            p("| %s | %s | %s |" % (s[0], s[1], " | ".join(cells)))
        p("")


if __name__ == "__main__":
    sys.exit(main())
