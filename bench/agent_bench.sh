#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Agent tap benchmark: fio --ioengine=nbd against the cdp-agent capture tap and
# against `nbdkit file` on the same backing file, in the same run.
#
#   bench/agent_bench.sh [BUILD_DIR=build-agent] [SIZE_MB=1024] [RUNTIME_S=20]
#
# Needs: fio (with the nbd engine), nbdkit, python3; the targets cdp-agent and
# agent_sink (cmake --build BUILD_DIR --target cdp-agent agent_sink).
# The agent runs with its sender active against agent_sink (a test peer that
# acknowledges every batch at once), so the agent pays for capture, queueing,
# framing and sending. A second agent then runs with capture_only (no sender:
# the tap alone). Prints one Markdown table: IOPS, MB/s, ratio agent/nbdkit,
# and agent CPU seconds per GB captured.
set -euo pipefail
B=${1:-build-agent}
SIZE_MB=${2:-1024}
RT=${3:-20}
AGENT="$B/agent/cdp-agent"
SINK="$B/agent/tests/agent_sink"
for p in fio nbdkit python3 "$AGENT" "$SINK"; do
  command -v "$p" >/dev/null || { echo "missing: $p" >&2; exit 2; }
done
W=$(mktemp -d /tmp/cdp-agent-bench-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
TCK=$(getconf CLK_TCK)

wait_for() {  # wait_for FILE SECONDS
  for _ in $(seq 1 $(( $2 * 20 ))); do [ -e "$1" ] && return 0; sleep 0.05; done
  echo "timed out waiting for $1" >&2; exit 1
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# fio_run NAME URI RW BS QD -> prints "iops bytes_per_s io_bytes"
fio_run() {
  fio --name="$1" --ioengine=nbd --uri="$2" --rw="$3" --bs="$4" --iodepth="$5" \
      --size="${SIZE_MB}M" --time_based --runtime="$RT" --numjobs=1 \
      --output-format=json --output="$W/$1.json" >/dev/null
  python3 - "$W/$1.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["write"]
print(j["iops"], j["bw_bytes"], j["io_bytes"])
PY
}

truncate -s "${SIZE_MB}M" "$W/vol.img"

# --- nbdkit file ---
nbdkit --foreground --unix "$W/nbdkit.sock" file "$W/vol.img" &
PIDS+=($!)
wait_for "$W/nbdkit.sock" 10
NK_URI="nbd+unix:///?socket=$W/nbdkit.sock"
read -r nk_r_iops nk_r_bw _ < <(fio_run nk-rand "$NK_URI" randwrite 4k 32)
read -r nk_s_iops nk_s_bw _ < <(fio_run nk-seq "$NK_URI" write 1M 8)
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true; unset 'PIDS[-1]'

# --- cdp-agent tap, sender active against agent_sink ---
"$SINK" $(( SIZE_MB * 1024 * 1024 )) > "$W/sink.out" &
PIDS+=($!)
for _ in $(seq 1 100); do grep -q port "$W/sink.out" && break; sleep 0.05; done
PORT=$(awk '/port/{print $2}' "$W/sink.out")
"$AGENT" --volume "vol=$W/vol.img" --nbd_listen none --nbd_unix "$W/agent.sock" \
  --ps "127.0.0.1:$PORT" --tenant bench --secret benchsecret --client_id bench \
  --bitmap_dir "$W/bm" --control 127.0.0.1:0 --log.level warn > "$W/agent.out" 2> "$W/agent.log" &
AP=$!
PIDS+=($AP)
for _ in $(seq 1 200); do grep -q control_port "$W/agent.out" && break; sleep 0.05; done
CPORT=$(sed -n 's/.*control_port=\([0-9]*\).*/\1/p' "$W/agent.out")
# Wait for the initial sync (hash comparison of every region) to finish.
python3 - "$CPORT" <<'PY'
import json, sys, time, urllib.request
for _ in range(1200):
    v = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/status"))["volumes"][0]
    if v.get("connected") and v["resync_remaining"] == 0:
        sys.exit(0)
    time.sleep(0.1)
sys.exit("initial sync did not finish")
PY
AG_URI="nbd+unix:///vol?socket=$W/agent.sock"
c0=$(cpu_ticks $AP)
read -r ag_r_iops ag_r_bw ag_r_bytes < <(fio_run ag-rand "$AG_URI" randwrite 4k 32)
c1=$(cpu_ticks $AP)
read -r ag_s_iops ag_s_bw ag_s_bytes < <(fio_run ag-seq "$AG_URI" write 1M 8)
c2=$(cpu_ticks $AP)
STATUS=$(python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:$CPORT/status').read().decode())")
kill $AP; wait $AP 2>/dev/null || true

# --- cdp-agent tap alone (capture_only: no sender; past the budget the queue
# degrades to bitmap mode, so this is the ceiling of the tap itself) ---
"$AGENT" --volume "vol=$W/vol.img" --nbd_listen none --nbd_unix "$W/agent2.sock" --capture_only true \
  --bitmap_dir "$W/bm2" --control none --log.level error > "$W/agent2.out" 2> "$W/agent2.log" &
AP2=$!
PIDS+=($AP2)
wait_for "$W/agent2.sock" 10
AG2_URI="nbd+unix:///vol?socket=$W/agent2.sock"
d0=$(cpu_ticks $AP2)
read -r co_r_iops co_r_bw co_r_bytes < <(fio_run co-rand "$AG2_URI" randwrite 4k 32)
d1=$(cpu_ticks $AP2)
read -r co_s_iops co_s_bw co_s_bytes < <(fio_run co-seq "$AG2_URI" write 1M 8)
d2=$(cpu_ticks $AP2)

python3 - <<PY
tck = $TCK
rows = [
  ("4k randwrite QD32", $nk_r_iops, $nk_r_bw, $ag_r_iops, $ag_r_bw, ($c1 - $c0) / tck, $ag_r_bytes),
  ("1M seq write QD8", $nk_s_iops, $nk_s_bw, $ag_s_iops, $ag_s_bw, ($c2 - $c1) / tck, $ag_s_bytes),
  ("4k randwrite QD32, tap only", $nk_r_iops, $nk_r_bw, $co_r_iops, $co_r_bw, ($d1 - $d0) / tck, $co_r_bytes),
  ("1M seq write QD8, tap only", $nk_s_iops, $nk_s_bw, $co_s_iops, $co_s_bw, ($d2 - $d1) / tck, $co_s_bytes),
]
print("| workload | nbdkit file IOPS | nbdkit MB/s | cdp-agent IOPS | cdp-agent MB/s | ratio agent/nbdkit | agent CPU s | agent CPU s/GB |")
print("|---|---|---|---|---|---|---|---|")
for name, ni, nb, ai, ab, cpu, io in rows:
    gb = io / 1e9
    print(f"| {name} | {ni:,.0f} | {nb/1e6:,.1f} | {ai:,.0f} | {ab/1e6:,.1f} | {ai/ni:.2f} | {cpu:.2f} | {cpu/gb if gb else 0:.2f} |")
PY
echo
echo "agent status after the run: $STATUS" | cut -c1-600
