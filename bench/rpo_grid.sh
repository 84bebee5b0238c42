#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# rpo_grid.sh: issue 42's targets grid: RPO lag at 90% of the link for every
# link x workload, one bench/rpo_bench.sh run (one step, UTIL) per cell (root).
#
# usage: rpo_grid.sh BUILD_DIR [SECONDS=20] [OUT_DIR=/tmp/rpo-grid]
# environment: LINKS ("100:12.5 100:50 1000:12.5", RATE_MBIT:ONE_WAY_DELAY_MS),
#   THETAS ("0.8 0.9 0.99"), SIZES ("4KiB 64KiB 1MiB"), FLUSHES ("8MiB 0":
#   a flush every 8 MiB, none), UTIL (90), COMPRESSIBILITY (0.75), CALIB_SECS (8).
#
# Each cell deploys the product as it ships (loadgen/wan_deploy.sh: TLS,
# certificates, tokens), calibrates the compression ratio, runs the churn for
# SECONDS and prints one row: the measured utilisation, lag p50/p99/max, the
# verdict against the target (p99 <= 2 s; "not reached" when the machine
# could not drive the link to within 5 points of UTIL) and the cell's stage
# breakdown (rpo_bench.sh's second table). Rows also go to OUT_DIR/grid.csv.
# A cell whose run fails is reported in its row, the grid goes on, and the
# script exits 1 at the end.
set -euo pipefail
BUILD=$1 SECS=${2:-20} OUT=${3:-/tmp/rpo-grid}
LINKS=${LINKS:-"100:12.5 100:50 1000:12.5"} THETAS=${THETAS:-"0.8 0.9 0.99"}
SIZES=${SIZES:-"4KiB 64KiB 1MiB"} FLUSHES=${FLUSHES:-"8MiB 0"} UTIL=${UTIL:-90}
export COMPRESSIBILITY=${COMPRESSIBILITY:-0.75} CALIB_SECS=${CALIB_SECS:-8}
here=$(dirname "$0") failed=0
mkdir -p "$OUT"
echo "link,rtt_ms,theta,io_size,flush_every,util_measured,p50_s,p99_s,max_s,verdict,frames_per_s,kib_per_frame,read_s,encode_s,write_s,write_cpu_s,throttle_wait_s,ps_ack_ms,mt_receive_cpu_s,mt_queue_ms,mt_apply_s,mt_ms_per_group,agent_ack_ms" >"$OUT/grid.csv"
echo "| link | RTT | theta | write | flush | utilisation | lag p50 s | lag p99 s | lag max s | p99 <= 2 s | PS write->Ack ms | MT apply s/s | encode s/s | KiB/frame |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"
for link in $LINKS; do
  rate=${link%%:*} delay=${link##*:}
  for theta in $THETAS; do
    for size in $SIZES; do
      for flush in $FLUSHES; do
        cell="$OUT/cell"
        rm -rf "$cell"
        PATTERN="zipf:$theta" IO_SIZE=$size FLUSH_EVERY=$flush \
          bash "$here/rpo_bench.sh" "$BUILD" "$UTIL" "$SECS" "$rate" "$delay" "$cell" >"$OUT/cell.log" 2>&1 || {
          echo "| ${rate} Mbit/s | $(awk -v d="$delay" 'BEGIN {print 2 * d}') ms | $theta | $size | $flush | the run failed: $(tail -n 1 "$OUT/cell.log") |"
          failed=1
          continue
        }
        r=$(tail -n 1 "$cell/rpo.csv") g=$(tail -n 1 "$cell/stages.csv")
        row=$(awk -F, -v r="$r" -v g="$g" -v rate="$rate" -v delay="$delay" -v theta="$theta" -v size="$size" \
          -v flush="$flush" -v util="$UTIL" 'BEGIN {
            split(r, a, ","); n = split(g, b, ",")
            v = (a[6] <= 2 ? "met" : "missed"); if (a[4] < util - 5) v = v " (not reached)"
            s = ""; for (i = 2; i <= n; i++) s = s "," b[i]
            printf "%s,%g,%s,%s,%s,%s,%s,%s,%s,%s%s\n", rate, 2 * delay, theta, size, flush, a[4], a[5], a[6], a[7], v, s }')
        echo "$row" >>"$OUT/grid.csv"
        echo "$row" | awk -F, '{printf "| %s Mbit/s | %s ms | %s | %s | %s | %s%% | %s | %s | %s | %s | %s | %s | %s | %s |\n",
          $1, $2, $3, $4, ($5 == "0" ? "none" : $5), $6, $7, $8, $9, $10, $18, $21, $14, $12}'
      done
    done
  done
done
exit $failed
