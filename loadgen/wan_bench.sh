#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# wan_bench.sh: process server -> master target goodput through `cdp-loadgen wanem` (root).
#
# usage: wan_bench.sh BUILD_DIR RATE_MBIT ONE_WAY_DELAY_MS CONNECTIONS [SECONDS]
#
# The deployment is loadgen/wan_deploy.sh's. cdp-loadgen churn writes
# incompressible data (compressibility 0) into the agent's export faster than
# the link; the PS (codec none) ships over the emulated WAN with CONNECTIONS
# parallel streams. After a warm-up the rate of cdp_ps_bytes_out_total (frame
# bytes, so it includes framing) is measured over SECONDS.
set -euo pipefail
BUILD=$1 RATE=$2 DELAY=$3 CONNS=$4 SECS=${5:-20}
# shellcheck source=loadgen/wan_deploy.sh
source "$(dirname "$0")/wan_deploy.sh"
wan_up "$BUILD" "$RATE" "$DELAY" none "$CONNS"
$A "$LG" churn --target "nbd+unix:///v?socket=$WAN_DIR/agent/nbd.sock" --rate $((RATE / 8 * 2)) --duration $((SECS + 15)) \
  --pattern seq --io-size 1MiB --compressibility 0 --json >"$WAN_DIR/churn.json" 2>/dev/null &
WAN_PIDS+=($!)
sleep 8  # warm-up: TCP slow start and a spool backlog (a benchmark, not a test)
b0=$(ps_metric cdp_ps_bytes_out_total); t0=$(date +%s.%N)
sleep "$SECS"
b1=$(ps_metric cdp_ps_bytes_out_total); t1=$(date +%s.%N)
awk -v b0="$b0" -v b1="$b1" -v t0="$t0" -v t1="$t1" -v r="$RATE" -v d="$DELAY" -v c="$CONNS" 'BEGIN {
  m = (b1 - b0) * 8 / (t1 - t0) / 1e6;
  printf "link %g Mbit/s, RTT %g ms, %d connection(s): PS -> MT %.2f Mbit/s = %.1f%% of the link\n", r, 2 * d, c, m, m / r * 100 }'
