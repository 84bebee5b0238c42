#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# export_profile.sh: the server's work per read of a point-in-time export beside
# `nbdkit file`, in counts that a busy machine does not disturb (the
# investigation of issue 17: "where the export is slower than nbdkit file by
# more than 20%, find out why").
#
# usage: export_profile.sh BUILD_DIR callgrind|strace [CHUNKS=512,4096,65536,1048576] [N=200]
#   environment: SERVERS="kit p2 p1" (which to count), REPEAT=3 (each count is
#   the least of REPEAT runs), MT_BINARY=PATH (another master-target build, for
#   a before/after), KEEP_PROFILE=DIR (keep the callgrind dumps)
#
#   callgrind  the master target and nbdkit run under valgrind --tool=callgrind;
#              instructions executed by the whole server process per read
#   strace     strace -f -c attached to each server; system calls per read, by name
#
# The deployment is bench/seed_bench.sh's (WAN=0, QUICK=1: a 16 MiB volume,
# exports p1 and p2, nbdkit serving the p1 image). For each server, transport
# (TLS, then plain after a restart of the master target with nbd_tls = off)
# and chunk size, one client (bench/export_bench, libnbd) reads N and then 2N
# chunks sequentially, one read in flight, each run on its own connection;
# per read = (count(2N) - count(N)) / N, which cancels the connection's own
# cost (TCP, TLS and NBD handshakes). Prints one Markdown table.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
TOOL=$2 CHUNKS=${3:-512,4096,65536,1048576} N=${4:-200}
PROF=$(mktemp -d /var/tmp/export-profile.XXXXXX)
case $TOOL in
  callgrind)
    command -v valgrind >/dev/null || { echo "export_profile: valgrind is missing" >&2; exit 2; }
    export MT_WRAP="valgrind --tool=callgrind --callgrind-out-file=$PROF/mt.%p.out"
    export KIT_WRAP="valgrind --tool=callgrind --trace-children=no --callgrind-out-file=$PROF/kit.%p.out"
    ;;
  strace) command -v strace >/dev/null || { echo "export_profile: strace is missing" >&2; exit 2; } ;;
  *) echo "usage: export_profile.sh BUILD_DIR callgrind|strace [CHUNKS] [N]" >&2; exit 2 ;;
esac
export WAN=0 QUICK=1 SEED_SETUP_ONLY=1
# shellcheck source=bench/seed_bench.sh
source "$here/seed_bench.sh" "$1" "$PROF/out"
# KEEP_PROFILE=DIR: the callgrind dumps (callgrind_annotate them) stay in DIR.
trap 'bench_cleanup; if [ -n "${KEEP_PROFILE:-}" ]; then mkdir -p "$KEEP_PROFILE"; cp "$PROF"/*.out* "$KEEP_PROFILE"/ 2>/dev/null || true; fi; rm -rf "$PROF"' EXIT

KIT_TLS_PID=${BENCH_EXTRA_PIDS[0]} KIT_PLAIN_PID=${BENCH_EXTRA_PIDS[1]}

# count PID ARGS...: the smallest of REPEAT (3) counts of the server's work for
# a run of the client with ARGS (background work of the daemon, e.g. its
# timers, only ever adds).
count() {
  local pid=$1 best="" v _
  shift
  for _ in $(seq "${REPEAT:-3}"); do
    v=$(count_once "$pid" "$@")
    if [ -z "$best" ]; then best=$v; continue; fi
    if [ "$TOOL" = callgrind ]; then
      [ "$v" -lt "$best" ] && best=$v
    else
      best=$(python3 -c 'import sys
tot = lambda s: sum(int(kv.split("=")[1]) for kv in s.split() if kv.split("=")[1].isdigit())
a, b = sys.argv[1], sys.argv[2]
print(a if tot(a) <= tot(b) else b)' "$best" "$v")
    fi
  done
  echo "$best"
}
# count_once PID ARGS...: runs the client with ARGS and prints the server's
# count for that run: instructions (callgrind) or "name=calls ..." (strace).
count_once() {
  local pid=$1
  shift
  case $TOOL in
    callgrind)
      callgrind_control -z "$pid" >/dev/null
      "$EXPORT_BENCH" "$@" >/dev/null
      sleep 0.5  # let the server finish the disconnect
      local before
      before=$(ls "$PROF" | wc -l)
      callgrind_control -d "$pid" >/dev/null
      local f
      f=$(ls -t "$PROF"/*."$pid".out* | head -n1)
      [ "$(ls "$PROF" | wc -l)" -gt "$before" ] || { echo "export_profile: no dump for $pid" >&2; exit 1; }
      awk '/^(summary|totals):/ {print $2; exit}' "$f"
      ;;
    strace)
      strace -f -c -o "$PROF/strace.out" -p "$pid" 2>/dev/null &
      local sp=$!
      sleep 1
      "$EXPORT_BENCH" "$@" >/dev/null
      sleep 0.5
      kill -INT $sp
      wait $sp 2>/dev/null || true
      awk '$1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" {print $NF "=" $4}' "$PROF/strace.out" | tr '\n' ' '
      ;;
  esac
}

# per_read PID LABEL CHUNK TLS_DIR EXPORT PORT
per_read() {
  local pid=$1 label=$2 c=$3 tls=$4 name=$5 port=$6
  local args=(--host $H --port "$port" --export "$name" --mode chunks --chunks "$c" --bytes 0 --no_header)
  [ -n "$tls" ] && args+=(--tls_dir "$tls")
  local a b
  a=$(count "$pid" "${args[@]}" --reads "$N")
  b=$(count "$pid" "${args[@]}" --reads $((2 * N)))
  if [ "$TOOL" = callgrind ]; then
    echo "| $label | $c | $(awk -v a="$a" -v b="$b" -v n="$N" -v c="$c" 'BEGIN {printf "%.0f | %.1f", (b - a) / n, (b - a) / n / c}') |"
  else
    # calls per read of each system call whose count grew with the reads
    echo "| $label | $c | $(python3 - "$a" "$b" "$N" <<'EOF'
import sys
def parse(s):
    d = {}
    for kv in s.split():
        k, _, v = kv.partition("=")
        if v.isdigit():
            d[k] = int(v)
    return d
a, b, n = parse(sys.argv[1]), parse(sys.argv[2]), int(sys.argv[3])
out = []
for k in sorted(set(a) | set(b)):
    per = (b.get(k, 0) - a.get(k, 0)) / n
    if per >= 0.05:
        out.append("%s %.2f" % (k, per))
tot = sum((b.get(k, 0) - a.get(k, 0)) for k in set(a) | set(b)) / n
print("%.2f | %s" % (tot, ", ".join(out)))
EOF
) |"
  fi
}

if [ "$TOOL" = callgrind ]; then
  echo "| server | chunk | instructions per read | per byte |"
  echo "|---|---:|---:|---:|"
else
  echo "| server | chunk | system calls per read | by name |"
  echo "|---|---:|---:|---|"
fi
# SERVERS: which of kit, p2, p1 (default all three).
SERVERS=${SERVERS:-"kit p2 p1"}
on() { [[ " $SERVERS " == *" $1 "* ]]; }
IFS=, read -r -a sizes <<<"$CHUNKS"
for c in "${sizes[@]}"; do
  if on kit; then per_read "$KIT_TLS_PID" "nbdkit file, TLS" "$c" "$P/nbd-client" "" $KIT_TLS; fi
  if on p2; then per_read "$MT_PID" "export p2 (latest), TLS" "$c" "$P/nbd-client" "$E2" $MT_NBD_PORT; fi
  if on p1; then per_read "$MT_PID" "export p1 (1/8 rewritten), TLS" "$c" "$P/nbd-client" "$E1" $MT_NBD_PORT; fi
done
mt_nbd_plain
E1=$(export_of p1) E2=$(export_of p2)
for c in "${sizes[@]}"; do
  if on kit; then per_read "$KIT_PLAIN_PID" "nbdkit file, plain" "$c" "" "" $KIT_PLAIN; fi
  if on p2; then per_read "$MT_PID" "export p2 (latest), plain" "$c" "" "$E2" $MT_NBD_PORT; fi
  if on p1; then per_read "$MT_PID" "export p1 (1/8 rewritten), plain" "$c" "" "$E1" $MT_NBD_PORT; fi
done
