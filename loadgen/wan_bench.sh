#!/usr/bin/env bash
# wan_bench.sh: process server -> master target goodput through `cdp-loadgen wanem` (root).
#
# usage: wan_bench.sh BUILD_DIR RATE_MBIT ONE_WAY_DELAY_MS CONNECTIONS [SECONDS]
#
# The master target runs in netns wan-b (10.77.0.2), process server and agent in
# wan-a. cdp-loadgen churn writes incompressible data (compressibility 0) into the
# agent's export faster than the link; the PS (codec none) ships over the emulated
# WAN with CONNECTIONS parallel streams. After a warm-up the rate of
# cdp_ps_bytes_out_total (frame bytes, so it includes framing) is measured over SECONDS.
set -euo pipefail
BUILD=$1 RATE=$2 DELAY=$3 CONNS=$4 SECS=${5:-20}
LG=$BUILD/loadgen/cdp-loadgen
DIR=$(mktemp -d /tmp/wanbench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  "$LG" wanem down --name wan >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
"$LG" wanem up --name wan --rate-mbit "$RATE" --delay-ms "$DELAY" >/dev/null
A="ip netns exec wan-a" Bn="ip netns exec wan-b"
mkdir -p "$DIR/mt" "$DIR/spool" "$DIR/agent"
truncate -s 4G "$DIR/source.img"
echo secret0123456789 > "$DIR/secret"
$Bn "$BUILD/master-target/cdp-master-target" --listen 10.77.0.2:7500 --control 127.0.0.1:9102 --nbd 127.0.0.1:10810 \
  --data_dir "$DIR/mt" --tenant t:secret0123456789 --log.file "$DIR/mt.log" >/dev/null 2>&1 &
PIDS+=($!)
$A "$BUILD/process-server/cdp-process-server" --listen 127.0.0.1:7400 --control 127.0.0.1:9101 --mt 10.77.0.2:7500 \
  --tenant t:secret0123456789 --spool_dir "$DIR/spool" --codec none --connections "$CONNS" --log.file "$DIR/ps.log" >/dev/null 2>&1 &
PIDS+=($!)
$A "$BUILD/agent/cdp-agent" --volume v="$DIR/source.img" --nbd_listen 127.0.0.1:10809 --ps 127.0.0.1:7400 --tenant t \
  --secret_file "$DIR/secret" --bitmap_dir "$DIR/agent" --control 127.0.0.1:9100 --log.file "$DIR/agent.log" >/dev/null 2>&1 &
PIDS+=($!)
for port in 9100 9101; do
  for _ in $(seq 100); do $A curl -fs "http://127.0.0.1:$port/status" >/dev/null 2>&1 && break; sleep 0.1; done
done
for _ in $(seq 100); do $Bn curl -fs "http://127.0.0.1:9102/status" >/dev/null 2>&1 && break; sleep 0.1; done
out() { $A curl -fs http://127.0.0.1:9101/metrics | awk '/^cdp_ps_bytes_out_total/ {s += $2} END {printf "%.0f", s}'; }
$A "$LG" churn --target nbd://127.0.0.1:10809/v --rate $((RATE / 8 * 2)) --duration $((SECS + 15)) \
  --pattern seq --io-size 1MiB --compressibility 0 --json >"$DIR/churn.json" 2>/dev/null &
PIDS+=($!)
sleep 8
b0=$(out); t0=$(date +%s.%N)
sleep "$SECS"
b1=$(out); t1=$(date +%s.%N)
awk -v b0="$b0" -v b1="$b1" -v t0="$t0" -v t1="$t1" -v r="$RATE" -v d="$DELAY" -v c="$CONNS" 'BEGIN {
  m = (b1 - b0) * 8 / (t1 - t0) / 1e6;
  printf "link %g Mbit/s, RTT %g ms, %d connection(s): PS -> MT %.2f Mbit/s = %.1f%% of the link\n", r, 2 * d, c, m, m / r * 100 }'
