#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The tap under the whole pipeline (issue #41, target 3): fio --ioengine=nbd,
# 4 KiB random writes at QD32, against the agent's tap while the process
# server and the master target run on this machine (TLS and tokens: the
# product as it ships, through the one harness of bench/lib.sh), side by side
# with `nbdkit file` on the same machine in the same run. Twice:
#
#   free     every process may run on any core
#   pinned   fio and the server under test (cdp-agent or nbdkit) on CPU 0, the
#            process server and the master target on the other CPUs
#            (taskset -a: every thread, and the threads made later inherit it)
#
#   bash bench/tap_bench.sh BUILD_DIR [SIZE_MB=1024] [RUNTIME_S=20] [BS=4k] [QD=32]
#
# Each pipeline run starts a fresh cluster on a fresh sparse volume and waits
# for its initial sync. Prints a Markdown table: IOPS of both, the ratio, the
# agent's capture mode changes during the run (data -> metadata -> bitmap:
# what the queue did when the pipeline fell behind) and its CPU s/GB.
# STRICT=1 (the smoke run in `make test`): exit 1 when a run wrote nothing.
# PERF=DIR: a system-wide perf record of each pipeline run (bench/lib.sh).
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
bench_init tap_bench "${1:?usage: tap_bench.sh BUILD_DIR [SIZE_MB] [RUNTIME_S] [BS] [QD]}"
SIZE_MB=${2:-1024}
RT=${3:-20}
BS=${4:-4k}
QD=${5:-32}
bench_need fio nbdkit taskset python3
DIR=$BENCH_DIR
NCPU=$(nproc)
[ "$NCPU" -ge 2 ] || bench_die "pinned runs need 2 CPUs, this machine has $NCPU"
REST=$([ "$NCPU" -eq 2 ] && echo 1 || echo "1-$((NCPU - 1))")
bench_pki on
TCK=$(getconf CLK_TCK)
cpu_ticks() { awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }

# fio_run NAME URI PREFIX...: sets R_IOPS, R_BYTES
fio_run() {
  local name=$1 uri=$2
  shift 2
  "$@" fio --name="$name" --ioengine=nbd --uri="$uri" --rw=randwrite --bs="$BS" --iodepth="$QD" \
    --size="${SIZE_MB}M" --time_based --runtime="$RT" --numjobs=1 \
    --output-format=json --output="$DIR/$name.json" >/dev/null
  read -r R_IOPS R_BYTES < <(python3 - "$DIR/$name.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["write"]
print(j["iops"], j["io_bytes"])
PY
)
}

# nbdkit file on its own sparse image; PREFIX pins it (and fio) or not. Sets
# R_IOPS, R_BYTES.
nbdkit_run() {
  local mode=$1
  shift
  truncate -s "${SIZE_MB}M" "$DIR/nk-$mode.img"
  "$@" nbdkit --foreground --unix "$DIR/nk-$mode.sock" file "$DIR/nk-$mode.img" &
  local pid=$!
  BENCH_EXTRA_PIDS+=("$pid")
  for _ in $(seq 200); do [ -S "$DIR/nk-$mode.sock" ] && break; sleep 0.05; done
  [ -S "$DIR/nk-$mode.sock" ] || bench_die "nbdkit did not start"
  fio_run "nk-$mode" "nbd+unix:///?socket=$DIR/nk-$mode.sock" "$@"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -f "$DIR/nk-$mode.img"
}

modes() { agent_get /status | python3 -c 'import json,sys; v=json.load(sys.stdin)["volumes"][0]; print(v["to_metadata"] + v["to_bitmap"])'; }

# The whole pipeline: a fresh cluster and volume; PREFIX pins fio. Sets
# R_IOPS, R_BYTES, R_MODES, R_TICKS.
pipeline_run() {
  local mode=$1
  shift
  truncate -s "${SIZE_MB}M" "$DIR/vol-$mode.img"
  cluster_up "$DIR/c-$mode"
  agent_up vol="$DIR/vol-$mode.img"
  for _ in $(seq 1200); do
    [ "$(agent_get /status | json_num resync_remaining)" = 0 ] && break
    sleep 0.1
  done
  [ "$(agent_get /status | json_num resync_remaining)" = 0 ] || bench_die "initial sync did not finish"
  if [ "$mode" = pinned ]; then
    taskset -a -p -c 0 "$AG_PID" >/dev/null
    taskset -a -p -c "$REST" "$PS_PID" >/dev/null
    taskset -a -p -c "$REST" "$MT_PID" >/dev/null
  fi
  local m0 c0
  m0=$(modes)
  c0=$(cpu_ticks "$AG_PID")
  bench_perf_start "pipeline-$mode"
  fio_run "ag-$mode" "nbd+unix:///vol?socket=$CLUSTER_DIR/agent/nbd.sock" "$@"
  bench_perf_stop
  R_TICKS=$(( $(cpu_ticks "$AG_PID") - c0 ))
  R_MODES=$(( $(modes) - m0 ))
  cluster_down
  rm -f "$DIR/vol-$mode.img"
}

nbdkit_run free
nk_free=$R_IOPS nk_free_bytes=$R_BYTES
pipeline_run free
ag_free=$R_IOPS ag_free_bytes=$R_BYTES ag_free_modes=$R_MODES ag_free_ticks=$R_TICKS
nbdkit_run pinned taskset -c 0
nk_pin=$R_IOPS nk_pin_bytes=$R_BYTES
pipeline_run pinned taskset -c 0
ag_pin=$R_IOPS ag_pin_bytes=$R_BYTES ag_pin_modes=$R_MODES ag_pin_ticks=$R_TICKS

python3 - <<PY
tck = $TCK
rows = [
  ("free", $nk_free, $ag_free, $ag_free_modes, $ag_free_ticks / tck, $ag_free_bytes),
  ("pinned: fio + server on CPU 0, PS + MT on CPU $REST", $nk_pin, $ag_pin, $ag_pin_modes, $ag_pin_ticks / tck, $ag_pin_bytes),
]
print("| placement | nbdkit file IOPS | cdp-agent IOPS (PS + MT running, TLS) | agent / nbdkit | agent mode changes | agent CPU s/GB |")
print("|---|---:|---:|---:|---:|---:|")
for name, nk, ag, modes, cpu, io in rows:
    print(f"| {name} | {nk:,.0f} | {ag:,.0f} | {ag / nk:.2f} | {modes} | {cpu / (io / 1e9) if io else 0:.2f} |")
PY
for v in "$nk_free_bytes" "$ag_free_bytes" "$nk_pin_bytes" "$ag_pin_bytes"; do
  [ "$v" -gt 0 ] || bench_wrong "a run wrote nothing"
done
bench_finish
