#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The cost of `cdp-loadgen profile` (issue #44: at most 2% of one core at
# 10k write IOPS). fio writes 4 KiB at random at a fixed rate with direct I/O
# to a loop device of its own, twice in one run: without the profiler, then
# with it (tracefs, one row per second). Reports the profiler's CPU as a share
# of one core, fio's CPU both times (the tracepoint itself runs in the
# writer's context), the events lost, and the profile's figures against
# fio's own count.
#
#   bash bench/profile_bench.sh BUILD_DIR [SECONDS=20] [IOPS=10000]
#
# Root (losetup, tracefs), fio. STRICT=1 (the smoke run in `make test`):
# exit 1 when the profile's bytes differ from fio's by more than 2%.
set -euo pipefail
BUILD=${1:?usage: profile_bench.sh BUILD_DIR [SECONDS] [IOPS]}
SECS=${2:-20}
IOPS=${3:-10000}
LG="$BUILD/loadgen/cdp-loadgen"
for p in fio losetup python3 "$LG"; do command -v "$p" >/dev/null || { echo "missing: $p" >&2; exit 2; }; done
W=$(mktemp -d /tmp/cdp-profile-bench-XXXXXX)
LOOP=""
PROF=""
cleanup() {
  [ -z "$PROF" ] || kill "$PROF" 2>/dev/null || true
  wait 2>/dev/null || true
  [ -z "$LOOP" ] || losetup -d "$LOOP" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
truncate -s 1G "$W/disk.img"
LOOP=$(losetup --find --show "$W/disk.img")
TCK=$(getconf CLK_TCK)
ticks() { awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }

# fio_run NAME: fio's usr+sys CPU seconds and bytes written, from its JSON.
fio_run() {
  fio --name="$1" --filename="$LOOP" --direct=1 --ioengine=psync --rw=randwrite --bs=4k --size=256M \
    --rate_iops="$IOPS" --time_based --runtime="$SECS" --output-format=json --output="$W/$1.json" >/dev/null
  python3 - "$W/$1.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["elapsed"], j["write"]["io_bytes"], j["write"]["iops"])
PY
}

read -r base_cpu base_bytes base_iops < <(fio_run without)

"$LG" profile --device "$LOOP" --interval 1s --duration 1h --out "$W/profile.csv" &
PROF=$!
for _ in $(seq 200); do grep -q '^timestamp,' "$W/profile.csv" 2>/dev/null && break; sleep 0.05; done
grep -q '^timestamp,' "$W/profile.csv" || { echo "profile_bench: the profiler did not start" >&2; exit 1; }
p0=$(ticks "$PROF")
t0=$(date +%s.%N)
read -r with_cpu with_bytes with_iops < <(fio_run with)
# The rows of the last second: the profiler reads what is buffered within a second.
sleep 1.5
p1=$(ticks "$PROF")
t1=$(date +%s.%N)
kill -TERM "$PROF"
wait "$PROF" || true
PROF=""

python3 - "$W/profile.csv" <<PY
import sys
rows = [l.strip().split(",") for l in open(sys.argv[1]) if l[0].isdigit()]
got = sum(float(r[1]) for r in rows)
unique = sum(float(r[3]) for r in rows if r[3])
lost = sum(float(r[4]) for r in rows)
prof_cpu = ($p1 - $p0) / $TCK
wall = $t1 - $t0
print("| IOPS asked | fio IOPS without / with | profiler CPU (% of one core) | fio CPU s without / with | written by fio (with) | profile raw bytes | profile / fio | unique bytes | lost events |")
print("|---:|---|---:|---|---:|---:|---:|---:|---:|")
print(f"| $IOPS | {$base_iops:,.0f} / {$with_iops:,.0f} | {100 * prof_cpu / wall:.2f}% | {$base_cpu:.2f} / {$with_cpu:.2f} | {$with_bytes:,} | {got:,.0f} | {got / $with_bytes:.4f} | {unique:,.0f} | {lost:.0f} |")
ok = abs(got / $with_bytes - 1) <= 0.02 and lost == 0
if not ok:
    print("profile_bench: WRONG: the profile's bytes are not within 2% of fio's, or events were lost", file=sys.stderr)
    sys.exit(1 if "${STRICT:-0}" == "1" else 0)
PY
