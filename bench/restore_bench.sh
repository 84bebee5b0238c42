#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sparse restore benchmark (issue #41, target 1): `nbdcopy` of a point-in-time
# export (NBD over TLS, the tenant's certificate) to a sparse file, against the
# same `nbdcopy` from `nbdkit file` serving a copy of the image with TLS, and
# against copying only the data (a dense file of the data's size from nbdkit).
# All three daemons on this machine (loopback, TLS by `cdpctl pki`).
#
#   bash bench/restore_bench.sh BUILD_DIR [SIZE=64G] [DATA_MIB=1024]
#
# The volume holds DATA_MIB scattered 1 MiB extents of random data (seed 1),
# holes elsewhere. It is protected (initial sync, not measured) and tagged t;
# `cdpctl export vol@t` makes the point-in-time export. Each of RUNS rounds
# copies in this order: ours, nbdkit's, data only, each from a cold page cache
# (COLD=1, root: `sync; echo 3 > /proc/sys/vm/drop_caches` before every copy):
# a restore reads what is on disk, and the replica is written with O_DIRECT
# while nbdkit's copy of the image was just written through the page cache,
# so a warm run would compare a disk read with a memory read. The restored
# image is compared with the source, and the allocated bytes of each copy are
# reported.
# Targets: ours <= 1.3x nbdkit's time, and <= 1.5x the data-only copy.
#
# Environment: TIMEOUT=3600, TMPDIR=/var/tmp, KEEP=1, STRICT=1 (a missed
# correctness check fails the run; targets never do), RUNS=2, COLD=1 (0: the
# caches as they are; the smoke run in make test, which must not slow the
# tests beside it).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

usage="usage: restore_bench.sh BUILD_DIR [SIZE=64G] [DATA_MIB=1024]"
bench_init restore_bench "${1:?$usage}"
SIZE=$(numfmt --from=iec "${2:-64G}")
DATA_MIB=${3:-1024}
TIMEOUT=${TIMEOUT:-3600}
RUNS=${RUNS:-2}
COLD=${COLD:-1}
if [ "$COLD" = 1 ] && [ "$(id -u)" != 0 ]; then
  echo "restore_bench: COLD=1 drops the page cache and needs root (COLD=0: warm, and said so)" >&2
  exit 2
fi
bench_need python3 nbdcopy nbdkit cmp numfmt awk getconf /usr/bin/time
bench_pki on
say() { echo "restore_bench: $*" >&2; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b - a}'; }
allocated() { echo $(( $(stat -c %b "$1") * $(stat -c %B "$1") )); }
VOL=vol
D=$BENCH_DIR/run
mkdir -p "$D"

say "source: $(numfmt --to=iec "$SIZE") with $DATA_MIB MiB in 1 MiB extents"
python3 - "$D/source.img" "$SIZE" "$DATA_MIB" "$D/data.img" <<'PY'
import random, sys
path, size, n, dense = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r = random.Random(1)
mib = size >> 20
picked = sorted(r.sample(range(mib), min(n, mib)))
with open(path, "wb") as f, open(dense, "wb") as d:
    f.truncate(size)
    for m in picked:
        b = r.randbytes(1 << 20)
        f.seek(m << 20)
        f.write(b)
        d.write(b)
PY

cluster_up "$D"
agent_up "$VOL=$D/source.img"
say "initial sync (not measured)"
synced=0
for _ in $(seq $((TIMEOUT * 10))); do
  st=$(agent_get /status)
  if echo "$st" | grep -q '"resync_remaining":0' && echo "$st" | grep -q '"queue_records":0' &&
     [ "$(echo "$st" | json_num acked_seq)" = "$(mt_get /status | json_num applied_seq)" ]; then synced=1; break; fi
  sleep 0.1
done
[ "$synced" = 1 ] || bench_die "the initial sync did not finish within $TIMEOUT s"
ctl tag t >/dev/null
ctl --json export "$VOL@t" >"$D/export.json"
EXPORT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["export"])' "$D/export.json")
NBDC=$CDP_MT_NBD_TLS_DIR  # the tenant's NBD client certificate, made by the harness
OURS="nbds://127.0.0.1:$MT_NBD_PORT/$EXPORT?tls-certificates=$NBDC"

# nbdkit with TLS: a server certificate of the same site CA, as GnuTLS reads it.
K=$D/nbdkit-tls
mkdir -p "$K"
"$CTL" pki issue --dir "$BENCH_DIR/pki" --role mt --name nbdkit-ref --out "$K/server" >/dev/null
mv "$K/server.crt" "$K/server-cert.pem"
mv "$K/server.key" "$K/server-key.pem"
cp "$NBDC/ca-cert.pem" "$K/ca-cert.pem"
cp --sparse=always "$D/source.img" "$D/kit-source.img"
bench_pick_port KIT_PORT
bench_pick_port KIT_DENSE_PORT
nbdkit -f --exit-with-parent --tls=require --tls-certificates="$K" -p "$KIT_PORT" -r file "$D/kit-source.img" &
KIT_PID=$!
nbdkit -f --exit-with-parent --tls=require --tls-certificates="$K" -p "$KIT_DENSE_PORT" -r file "$D/data.img" &
KIT_DENSE_PID=$!
BENCH_EXTRA_PIDS+=("$KIT_PID" "$KIT_DENSE_PID")
for _ in $(seq 100); do ! bench_port_free "$KIT_PORT" && ! bench_port_free "$KIT_DENSE_PORT" && break; sleep 0.1; done
THEIRS="nbds://127.0.0.1:$KIT_PORT/?tls-certificates=$NBDC"
DENSE="nbds://127.0.0.1:$KIT_DENSE_PORT/?tls-certificates=$NBDC"

cache_state() {  # before each timed copy
  sync
  if [ "$COLD" = 1 ]; then echo 3 >/proc/sys/vm/drop_caches; fi
}
# What reached the disk holding the bench's files during each copy
# (/proc/diskstats of its partition: reads, sectors, merges, time reading),
# on stderr and in $D/disk.txt: the shape of the cold reads, ours against
# nbdkit's.
DISK=$(basename "$(df --output=source "$D" | tail -1)")
disk_reads() { awk -v d="$DISK" '$3 == d {print $4, $5, $6, $7}' /proc/diskstats; }
# CPU seconds (user + system) of a process so far.
cpu_of() { awk -v t="$(getconf CLK_TCK)" '{sub(/.*\) /, ""); printf "%.2f", ($12 + $13) / t}' "/proc/$1/stat"; }
copy() {  # SOURCE_URI DEST LABEL SERVER_PID: prints the seconds nbdcopy took
  cache_state
  rm -f "$2"
  local t0 t1 before after s0 s1
  before=$(disk_reads)
  s0=$(cpu_of "$4")
  bench_perf_start "${3// /-}"  # PERF=DIR: a profile of each copy (bench/lib.sh)
  t0=$(now); /usr/bin/time -f "%U %S" -o "$D/nbdcopy.cpu" nbdcopy "$1" "$2"; t1=$(now)
  bench_perf_stop
  s1=$(cpu_of "$4")
  after=$(disk_reads)
  # Where the copy's time went besides the disk: the server's and nbdcopy's CPU.
  awk -v l="$3" -v a="$s0" -v b="$s1" -v w="$(secs "$t0" "$t1")" '{printf "cpu during %s: server %.2f s, nbdcopy %.2f s, over %.2f s\n", l, b - a, $1 + $2, w}' \
    "$D/nbdcopy.cpu" | tee -a "$D/disk.txt" >&2
  if [ -n "$before" ] && [ -n "$after" ]; then
    echo "$before $after" | awk -v l="$3" -v dev="$DISK" '{r = $5 - $1; m = $6 - $2; s = $7 - $3; t = $8 - $4;
      printf "disk %s during %s: %d reads (%d merged), %.1f MiB, %.1f KiB per read, %d ms reading\n",
             dev, l, r, m, s / 2048, r ? s / 2 / r : 0, t}' | tee -a "$D/disk.txt" >&2
  fi
  secs "$t0" "$t1"
}
data_b=$((DATA_MIB << 20))
echo "| round | volume | data | page cache | ours (s) | nbdkit file (s) | data only (s) | ours / nbdkit | ours / data only | allocated: ours, nbdkit | restored = source |"
echo "|---|---|---:|---|---:|---:|---:|---|---|---|---|"
for round in $(seq "$RUNS"); do
  say "round $round: measured: nbdcopy from the point-in-time export"
  ours_s=$(copy "$OURS" "$D/restored.img" "round $round ours" "$MT_PID")
  say "round $round: reference: nbdcopy from nbdkit file (TLS)"
  kit_s=$(copy "$THEIRS" "$D/kit.img" "round $round nbdkit" "$KIT_PID")
  say "round $round: reference: nbdcopy of the data only (TLS)"
  dense_s=$(copy "$DENSE" "$D/dense.img" "round $round data-only" "$KIT_DENSE_PID")
  check=$(cmp -s "$D/source.img" "$D/restored.img" && echo identical || echo MISMATCH)
  [ "$check" = identical ] || bench_wrong "the restored image differs from the source"
  cmp -s "$D/source.img" "$D/kit.img" || bench_wrong "nbdkit's copy differs from the source"
  ours_a=$(allocated "$D/restored.img")
  kit_a=$(allocated "$D/kit.img")
  # Allocated within one extent of the data (rounding of nbdcopy and the file system).
  [ "$ours_a" -le $((data_b + (4 << 20))) ] || bench_wrong "the restored image allocates $ours_a bytes for $data_b of data"
  r_kit=$(awk -v a="$ours_s" -v b="$kit_s" 'BEGIN {printf "%.2f", a / b}')
  r_dense=$(awk -v a="$ours_s" -v b="$dense_s" 'BEGIN {printf "%.2f", a / b}')
  res_kit=$(awk -v r="$r_kit" 'BEGIN {print (r <= 1.3) ? "met" : "MISSED"}')
  res_dense=$(awk -v r="$r_dense" 'BEGIN {print (r <= 1.5) ? "met" : "MISSED"}')
  echo "| $round | $(numfmt --to=iec "$SIZE") | $DATA_MIB MiB | $([ "$COLD" = 1 ] && echo cold || echo as found) | $ours_s | $kit_s | $dense_s | $r_kit ($res_kit, target <= 1.3) | $r_dense ($res_dense, target <= 1.5) | $(numfmt --to=iec "$ours_a"), $(numfmt --to=iec "$kit_a") | $check |"
done
kill "$KIT_PID" "$KIT_DENSE_PID" 2>/dev/null || true
cluster_down
bench_finish
