#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# rpo_bench.sh: RPO lag against link utilisation through `cdp-loadgen wanem` (root).
#
# usage: rpo_bench.sh BUILD_DIR [UTILISATIONS="30 40 50 60 70 80 90"] [SECONDS=60]
#                     [RATE_MBIT=100] [ONE_WAY_DELAY_MS=12.5] [OUT_DIR=docs/rpo-bench]
#
# The deployment of loadgen/wan_deploy.sh with codec zstd (level 1) and one
# PS -> MT connection. `cdp-loadgen churn` writes through the agent's NBD tap
# (zipf:0.99 hot spot, 64 KiB writes, compressibility 0.75). A calibration run
# measures the compression ratio (each step's own ratio then steers the next); each step asks for the change rate whose
# compressed stream fills the wanted share of the link, and samples the RPO lag
# four times a second: the age of the oldest write not yet durable at the master
# target, i.e. max(oldest record in the PS spool, oldest record the agent has
# not had acknowledged). Between steps the backlog drains (deadline 120 s).
# Prints a Markdown table; writes rpo.csv and rpo.svg to OUT_DIR.
#
# Then, per step, where the stream's time went over the measured window
# (common/wire/stage_metrics.h; stages.csv): the PS's frames per second and
# record KiB per frame; the share of the PS's sending thread spent reading the
# spool, encoding (compression) and writing (TLS, throttle, kernel; its CPU
# part in brackets); the throttle's wait per second; the mean time from a
# frame's write to its Ack; at the MT the receiving thread's CPU share (TLS,
# decompression), the mean queue wait per message, the share of time applying
# and the mean time per group commit; the agent's mean write-to-Ack time.
#
# The workload (environment): PATTERN (zipf:0.99), IO_SIZE (64KiB),
# FLUSH_EVERY (16MiB; 0 = the writer never flushes), COMPRESSIBILITY (0.75);
# CALIB_SECS (15), the calibration run's length.
set -euo pipefail
BUILD=$1 UTILS=${2:-"30 40 50 60 70 80 90"} SECS=${3:-60} RATE=${4:-100} DELAY=${5:-12.5}
OUT=${6:-docs/rpo-bench}
PATTERN=${PATTERN:-zipf:0.99} IO_SIZE=${IO_SIZE:-64KiB} FLUSH_EVERY=${FLUSH_EVERY:-16MiB}
COMPRESSIBILITY=${COMPRESSIBILITY:-0.75} CALIB_SECS=${CALIB_SECS:-15}
# shellcheck source=loadgen/wan_deploy.sh
source "$(dirname "$0")/../loadgen/wan_deploy.sh"
wan_up "$BUILD" "$RATE" "$DELAY" zstd 1
mkdir -p "$OUT"
link_mbs=$(awk -v r="$RATE" 'BEGIN {print r / 8}')  # MB/s (10^6 bytes)

churn() {  # RATE_MBS SECONDS
  $A "$LG" churn --target "nbd+unix:///v?socket=$WAN_DIR/agent/nbd.sock" --rate "$1" --duration "$2" --pattern "$PATTERN" \
    --io-size "$IO_SIZE" --compressibility "$COMPRESSIBILITY" --flush-every "$FLUSH_EVERY" --json >"$WAN_DIR/churn.json" 2>/dev/null
}
# One row of stages.csv for step $1 over [$2, $3] from the snapshots s0 and s1.
stage_row() {
  local d=$WAN_DIR
  delta() {  # SIDE NAME [LABEL]
    awk -v a="$(prom_sum "$d/s0.$1" "$2" "${3:-}")" -v b="$(prom_sum "$d/s1.$1" "$2" "${3:-}")" 'BEGIN {printf "%.6f", b - a}'
  }
  local st='stage="'
  awk -v u="$1" -v secs="$(awk -v a="$2" -v b="$3" 'BEGIN {print b - a}')" \
    -v frames="$(delta ps cdp_ps_ship_frames_total)" -v raw="$(delta ps cdp_ps_ship_record_bytes_total)" \
    -v rd="$(delta ps cdp_ps_ship_seconds_total "${st}read\"")" \
    -v enc="$(delta ps cdp_ps_ship_seconds_total "${st}encode\"")" \
    -v wr="$(delta ps cdp_ps_ship_seconds_total "${st}write\"")" \
    -v wrc="$(delta ps cdp_ps_ship_seconds_total "${st}write_cpu\"")" \
    -v thr="$(delta ps cdp_ps_throttle_wait_seconds_total)" \
    -v ack="$(delta ps cdp_ps_ship_seconds_total "${st}ack\"")" -v acked="$(delta ps cdp_ps_ship_acked_frames_total)" \
    -v rcpu="$(delta mt cdp_mt_receive_seconds_total "${st}receive_cpu\"")" \
    -v q="$(delta mt cdp_mt_receive_seconds_total "${st}queue\"")" -v msgs="$(delta mt cdp_mt_receive_messages_total)" \
    -v ap="$(delta mt cdp_mt_receive_seconds_total "${st}apply\"")" -v groups="$(delta mt cdp_mt_receive_groups_total)" \
    -v aack="$(delta agent cdp_agent_ship_seconds_total "${st}ack\"")" \
    -v aacked="$(delta agent cdp_agent_ship_acked_frames_total)" 'BEGIN {
      f = frames > 0 ? frames : 1
      printf "%d,%.1f,%.0f,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f,%.3f,%.2f,%.3f,%.1f,%.1f\n", u, frames / secs, raw / f / 1024,
        rd / secs, enc / secs, wr / secs, wrc / secs, thr / secs, (acked > 0 ? ack / acked * 1000 : 0), rcpu / secs,
        (msgs > 0 ? q / msgs * 1000 : 0), ap / secs, (groups > 0 ? ap / groups * 1000 : 0),
        (aacked > 0 ? aack / aacked * 1000 : 0) }'
}

# Calibration: the ratio raw / wire of this data at zstd-1.
r0=$(ps_metric cdp_ps_raw_bytes_out_total) w0=$(ps_metric cdp_ps_bytes_out_total)
churn "$(awk -v l="$link_mbs" 'BEGIN {print l * 0.5}')" "$CALIB_SECS"
wan_drain
r1=$(ps_metric cdp_ps_raw_bytes_out_total) w1=$(ps_metric cdp_ps_bytes_out_total)
ratio=$(awk -v r="$((${r1%.*} - ${r0%.*}))" -v w="$((${w1%.*} - ${w0%.*}))" 'BEGIN {printf "%.3f", r / w}')
echo "link $RATE Mbit/s, RTT $(awk -v d="$DELAY" 'BEGIN {print 2 * d}') ms, zstd-1 ratio $ratio on this data"
echo
echo "| asked utilisation | change rate MB/s | wire Mbit/s | measured utilisation | lag p50 s | lag p99 s | lag max s |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
echo "util_asked,change_mbs,wire_mbit,util_measured,p50_s,p99_s,max_s" >"$OUT/rpo.csv"
: >"$WAN_DIR/stages"
for u in $UTILS; do
  mbs=$(awk -v u="$u" -v l="$link_mbs" -v r="$ratio" 'BEGIN {printf "%.2f", u / 100 * l * r}')
  churn "$mbs" $((SECS + 5)) &
  cpid=$!
  sleep 5  # warm-up (a benchmark, not a test)
  w0=$(ps_metric cdp_ps_bytes_out_total); t0=$(date +%s.%N)
  wan_snap "$WAN_DIR/s0"
  : >"$WAN_DIR/lag"
  while kill -0 "$cpid" 2>/dev/null; do wan_lag >>"$WAN_DIR/lag"; echo >>"$WAN_DIR/lag"; sleep 0.25; done
  wait "$cpid"
  w1=$(ps_metric cdp_ps_bytes_out_total); t1=$(date +%s.%N)
  wan_snap "$WAN_DIR/s1"
  stage_row "$u" "$t0" "$t1" >>"$WAN_DIR/stages"
  if [ "$(tail -n 1 "$WAN_DIR/stages" | cut -d, -f2)" = "0.0" ]; then
    echo "step $u%: the PS counted no frames sent (cdp_ps_ship_frames_total) while the churn ran" >&2
    exit 1
  fi
  row=$(sort -n "$WAN_DIR/lag" | awk NF | awk -v u="$u" -v m="$mbs" -v w="$(awk -v a="$w0" -v b="$w1" -v s="$t0" -v e="$t1" 'BEGIN {printf "%.2f", (b - a) * 8 / (e - s) / 1e6}')" -v r="$RATE" '
    {v[NR] = $1} END {
      p50 = v[int(NR * 0.50 + 0.5)]; p99 = v[int(NR * 0.99 + 0.5)]; if (p99 == "") p99 = v[NR]
      printf "%d,%s,%s,%.1f,%s,%s,%s\n", u, m, w, w / r * 100, p50, p99, v[NR] }')
  echo "$row" >>"$OUT/rpo.csv"
  # The ratio of this step's data steers the next step (zipf rewrites compress differently over time).
  ratio=$(echo "$row" | awk -F, -v r="$ratio" '{print ($3 > 0 ? $2 / ($3 / 8) : r)}')
  echo "$row" | awk -F, '{printf "| %d%% | %s | %s | %s%% | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7}'
  wan_drain
done

echo
echo "Where the stream's time went (seconds per second are the share of one thread):"
echo
echo "| asked | PS frames/s | KiB/frame | spool read s/s | encode s/s | write s/s (cpu) | throttle wait s/s | PS write->Ack ms | MT receive cpu s/s | MT queue ms | MT apply s/s | ms/group | agent write->Ack ms |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
echo "util_asked,frames_per_s,kib_per_frame,read_s,encode_s,write_s,write_cpu_s,throttle_wait_s,ps_ack_ms,mt_receive_cpu_s,mt_queue_ms,mt_apply_s,mt_ms_per_group,agent_ack_ms" >"$OUT/stages.csv"
cat "$WAN_DIR/stages" >>"$OUT/stages.csv"
awk -F, '{printf "| %d%% | %s | %s | %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14}' "$WAN_DIR/stages"

# SVG: lag p50/p99 (log scale, 0.01..100 s) against measured utilisation.
awk -F, 'NR > 1 {u[NR] = $4; a[NR] = $5; b[NR] = $6; n = NR} END {
  W = 640; H = 400; L = 60; R = 20; T = 20; B = 50

  print "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" W "\" height=\"" H "\" font-family=\"sans-serif\" font-size=\"12\">"
  print "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
  for (d = -2; d <= 2; d++) { y = T + (H - T - B) * (2 - d) / 4
    printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g s</text>\n", L, y, W - R, y, L - 5, y + 4, 10 ^ d }
  for (p = 0; p <= 100; p += 20) { xx = L + (W - L - R) * p / 100
    printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d%%</text>\n", xx, T, xx, H - B, xx, H - B + 16, p }
  printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">link utilisation (compressed stream / link)</text>\n", (W + L) / 2, H - 10
  split("a b", keys); col["a"] = "#1f77b4"; col["b"] = "#d62728"; lab["a"] = "lag p50"; lab["b"] = "lag p99"
  for (k = 1; k <= 2; k++) { key = keys[k]; pts = ""
    for (i = 2; i <= n; i++) { v = (key == "a" ? a[i] : b[i]); if (v < 0.01) v = 0.01; if (v > 100) v = 100
      pts = pts sprintf("%.1f,%.1f ", L + (W - L - R) * u[i] / 100, T + (H - T - B) * (2 - log(v) / log(10)) / 4) }
    printf "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", col[key], pts
    printf "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>\n", L + 10, T + 15 * k, col[key], lab[key] }
  print "</svg>" }' "$OUT/rpo.csv" >"$OUT/rpo.svg"
