#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end benchmark: all three daemons on this machine (loopback), one
# volume, `cdp-loadgen churn` pushing writes through the agent's NBD export as
# fast as the pipeline accepts them. Reports
#   - sustained end-to-end change rate: bytes written / (time from the first
#     write until the master target has applied the last one),
#   - CPU seconds per GB of change for each daemon (process_cpu_seconds_total
#     of each /metrics, before and after),
#   - beside it, in the same run, single-core lz4 -1 and zstd -1 compression
#     speed (the CLIs' -b mode, one thread) on the bytes the churn wrote.
#
#   bash bench/e2e_bench.sh BUILD_DIR [SECONDS=20] [COMPRESSIBILITY=0.75] [CODEC=zstd] [TLS=on] [ENCRYPTION=off]
#
# ENCRYPTION=on seals the volume (tenant-side encryption, docs/encryption.md)
# with a key made by `cdpctl keys init`; compare in one sitting:
#   for e in off on off on; do bash bench/e2e_bench.sh build 20 0.75 zstd on $e; done
# "WAN MB/GB" is what the PS sent to the MT per GB of change.
#
# TLS=on (the product's default) makes a site CA and three certificates with
# `cdpctl pki` and runs agent->PS and PS->MT over TLS 1.3; TLS=off is clear text.
# Compare the two in one sitting: for t in off on off on; do bash ... zstd $t; done
#
# Prints a Markdown table row set; docs/benchmarks.md "End to end" records runs.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
bench_init e2e_bench "${1:?usage: e2e_bench.sh BUILD_DIR [SECONDS] [COMPRESSIBILITY] [CODEC] [TLS] [ENCRYPTION]}"
SECS=${2:-20}
COMP=${3:-0.75}
CODEC=${4:-zstd}
TLS=${5:-on}
ENC=${6:-off}
bench_need zstd lz4
DIR=$BENCH_DIR
die() { bench_die "$@"; }

SIZE=$((4 << 30))
truncate -s $SIZE "$DIR/source.img"
bench_pki "$TLS"
cluster_up "$DIR" --codec "$CODEC" --level 1
if [ "$ENC" = on ]; then
  "$CTL" keys init --out "$DIR/tenant.key" >/dev/null
  agent_up vol="$DIR/source.img" --encryption on --key_file "$DIR/tenant.key"
else
  agent_up vol="$DIR/source.img"
fi

cpu() { bench_get "$1" "$2" /metrics | awk '$1 == "process_cpu_seconds_total" {print $2}'; }
now() { date +%s.%N; }

# The initial sync of the (empty) volume finishes first: it is not change.
for _ in $(seq 600); do
  [ "$(agent_get /status | json_num resync_remaining)" = 0 ] && break
  sleep 0.1
done
A0=$(cpu $AG_CTL "$AG_TOKEN"); P0=$(cpu $PS_CTL "$PS_TOKEN"); M0=$(cpu $MT_CTL "$MT_TOKEN")
T0=$(now)
# 1 MiB sequential writes, rate far above what the pipeline can take: the
# agent's capture queue fills and the NBD client is paced by the pipeline.
"$LOADGEN" churn --target "nbd+unix:///vol?socket=$DIR/agent/nbd.sock" --rate 10000 --duration "$SECS" --pattern seq \
  --io-size 1MiB --compressibility "$COMP" --seed 7 --flush-every 256MiB --json > "$DIR/churn.json"
T1=$(now)
# Catch-up: every captured record applied at the master target.
deadline=$(( $(date +%s) + 600 ))
while :; do
  a=$(agent_get /status); m=$(mt_get /status)
  next=$(echo "$a" | json_num next_seq); applied=$(echo "$m" | json_num applied_seq)
  [ -n "$next" ] && [ -n "$applied" ] && [ "$applied" = $((next - 1)) ] && [ "$(echo "$a" | json_num queue_records)" = 0 ] && break
  [ "$(date +%s)" -lt $deadline ] || die "no catch-up within 600 s"
  sleep 0.05
done
T2=$(now)
A1=$(cpu $AG_CTL "$AG_TOKEN"); P1=$(cpu $PS_CTL "$PS_TOKEN"); M1=$(cpu $MT_CTL "$MT_TOKEN")
BYTES=$(json_num bytes < "$DIR/churn.json")
a=$(agent_get /status); p=$(ps_get /status)
MODE_CHANGES=$(( $(echo "$a" | json_num to_metadata) + $(echo "$a" | json_num to_bitmap) ))
PS_IN=$(echo "$p" | json_num bytes_in); PS_OUT=$(echo "$p" | json_num bytes_out)

# The same bytes through the compressors' CLIs, one thread, same run.
SAMPLE=$((BYTES < (256 << 20) ? BYTES : (256 << 20)))
head -c $SAMPLE "$DIR/source.img" > "$DIR/sample.bin"
ZSTD_LINE=$(zstd -b1 -e1 -T1 -i3 "$DIR/sample.bin" 2>&1 | tr '\r' '\n' | grep 'MB/s' | tail -n1)
LZ4_LINE=$(lz4 -b1 -e1 -i3 "$DIR/sample.bin" 2>&1 | tr '\r' '\n' | grep 'MB/s' | tail -n1)
speed() { echo "$1" | grep -oE '[0-9.]+ MB/s' | head -n1 | cut -d' ' -f1; }
ratio() { echo "$1" | grep -oE '\(x?[0-9.]+\)' | head -n1 | tr -d '()x '; }

awk -v b="$BYTES" -v t0="$T0" -v t1="$T1" -v t2="$T2" -v a0="$A0" -v a1="$A1" -v p0="$P0" -v p1="$P1" \
    -v m0="$M0" -v m1="$M1" -v zs="$(speed "$ZSTD_LINE")" -v zr="$(ratio "$ZSTD_LINE")" -v ls="$(speed "$LZ4_LINE")" \
    -v lr="$(ratio "$LZ4_LINE")" -v comp="$COMP" -v codec="$CODEC" -v secs="$SECS" -v modes="$MODE_CHANGES" \
    -v psin="$PS_IN" -v psout="$PS_OUT" -v tls="$TLS" -v enc="$ENC" 'BEGIN {
  gb = b / 1e9
  printf "| TLS | encryption | compressibility | PS codec | written (MB) | write phase (s) | until applied (s) | sustained e2e MB/s | agent CPU s/GB | PS CPU s/GB | MT CPU s/GB | PS in/out ratio | WAN MB/GB | agent mode changes | zstd -1 MB/s (1 core, ratio) | lz4 -1 MB/s (1 core, ratio) |\n"
  printf "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
  printf "| %s | %s | %s | %s -1 | %.0f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.0f | %d | %s (%s) | %s (%s) |\n", \
    tls, enc, comp, codec, b / 1e6, t1 - t0, t2 - t0, b / 1e6 / (t2 - t0), (a1 - a0) / gb, (p1 - p0) / gb, (m1 - m0) / gb, \
    (psout > 0 ? psin / psout : 0), psout / 1e6 / gb, modes, zs, zr, ls, lr
}'
echo
echo "PS bytes_in $PS_IN, bytes_out $PS_OUT; zstd: $ZSTD_LINE"
echo "lz4: $LZ4_LINE"
