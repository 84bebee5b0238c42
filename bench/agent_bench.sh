#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Agent tap benchmark: fio --ioengine=nbd against the cdp-agent capture tap and
# against `nbdkit file` on the same backing file, in the same run.
#
#   bench/agent_bench.sh [BUILD_DIR=build-agent] [SIZE_MB=1024] [RUNTIME_S=20]
#
# Needs: fio (with the nbd engine), nbdkit, python3; the targets cdp-agent,
# cdp-loadgen and agent_sink (cmake --build BUILD_DIR --target cdp-agent
# cdp-loadgen agent_sink). The agent is started by the local-cluster harness
# (`cdp-loadgen cluster --agent-ps`: its config, control token; no MT or PS)
# and runs with its sender active against agent_sink (a test peer that
# acknowledges every batch at once, in clear text), so the agent pays for
# capture, queueing, framing and sending. A second agent then runs with
# capture_only (no sender: the tap alone). Prints one Markdown table: IOPS, MB/s, ratio agent/nbdkit,
# and agent CPU seconds per GB captured.
set -euo pipefail
B=${1:-build-agent}
SIZE_MB=${2:-1024}
RT=${3:-20}
AGENT="$B/agent/cdp-agent"
SINK="$B/agent/tests/agent_sink"
LG="$B/loadgen/cdp-loadgen"
for p in fio nbdkit python3 "$AGENT" "$SINK" "$LG"; do
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

# agent_up NAME ARGS...: an agent protecting $W/vol.img as "vol", started by the
# harness in $W/NAME; sets AP (its pid), CPORT (its control port), TOKEN (file).
agent_up() {
  local name=$1
  shift
  "$LG" cluster --build "$B" --dir "$W/$name" --volume vol --volume-image "$W/vol.img" --tenant bench \
    --secret bench-secret-of-the-agent-sink --tls off --env-file "$W/$name.env" "$@" >/dev/null 2>"$W/$name.err" &
  PIDS+=($!)
  for _ in $(seq 1 1200); do [ -s "$W/$name.env" ] || ! kill -0 "${PIDS[-1]}" 2>/dev/null && break; sleep 0.05; done
  [ -s "$W/$name.env" ] || { echo "agent_bench: the harness did not start the agent:" >&2; cat "$W/$name.err" >&2; exit 1; }
  # shellcheck disable=SC1090
  source "$W/$name.env"
  AP=$CDP_AGENT_PID CPORT=${CDP_AGENT_CONTROL##*:} TOKEN=$CDP_AGENT_TOKEN_FILE
}
# agent_down: stops the harness (and so the agent).
agent_down() { kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true; unset 'PIDS[-1]'; }

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
agent_up a1 --agent-ps "127.0.0.1:$PORT" --agent-args="--client_id bench --log.level warn"
status() {  # the agent's /status, with its admin token
  python3 - "$CPORT" "$TOKEN" <<'PY'
import sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/status",
                             headers={"Authorization": "Bearer " + open(sys.argv[2]).read().strip()})
print(urllib.request.urlopen(req).read().decode())
PY
}
# Wait for the initial sync (hash comparison of every region) to finish.
python3 - "$CPORT" "$TOKEN" <<'PY'
import json, sys, time, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/status",
                             headers={"Authorization": "Bearer " + open(sys.argv[2]).read().strip()})
for _ in range(1200):
    v = json.load(urllib.request.urlopen(req))["volumes"][0]
    if v.get("connected") and v["resync_remaining"] == 0:
        sys.exit(0)
    time.sleep(0.1)
sys.exit("initial sync did not finish")
PY
AG_URI="nbd+unix:///vol?socket=$CDP_AGENT_NBD_SOCKET"
c0=$(cpu_ticks $AP)
read -r ag_r_iops ag_r_bw ag_r_bytes < <(fio_run ag-rand "$AG_URI" randwrite 4k 32)
c1=$(cpu_ticks $AP)
read -r ag_s_iops ag_s_bw ag_s_bytes < <(fio_run ag-seq "$AG_URI" write 1M 8)
c2=$(cpu_ticks $AP)
STATUS=$(status)
agent_down

# --- cdp-agent tap alone (capture_only: no sender; past the budget the queue
# degrades to bitmap mode, so this is the ceiling of the tap itself) ---
agent_up a2 --agent-ps 127.0.0.1:9 --agent-args="--capture_only true --log.level error"
AP2=$AP
AG2_URI="nbd+unix:///vol?socket=$CDP_AGENT_NBD_SOCKET"
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
