#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# anomaly_bench.sh: ransomware detection as it ships (issue #37), on the
# product deployed by `cdp-loadgen cluster` (TLS, certificates, tokens):
#
#   bench/anomaly_bench.sh BUILD_DIR [RUNS=20] [QUIET_S=600] [GB=1] [LEARN=30]
#
# 1. Detection delay, RUNS times: compressible churn (loadgen mix 0.75,
#    4 MB/s, random offsets) for LEARN + 8 s the first time, 65 s after
#    (longer than the detector's 60 s hold-off), then random data at 5x the rate (20
#    MB/s); the delay is from the switch to the agent's /status counting the
#    anomaly. Also checks the MT kept a suspect-clean point for each.
# 2. False positives: QUIET_S seconds split over loadgen's workload profiles
#    (seq, random and zipf:0.99 offsets; mixes 0.75, 0.5 and 0.25; a burst of
#    compressible data at 5x), no switch: anomalies counted.
# 3. CPU: the agent's CPU seconds per GB captured for GB of mixed churn at 100
#    MB/s, with detection on, then on a second cluster with
#    anomaly.enabled=false, and the detector alone (bench/anomaly_cost).
#
# LEARN: anomaly.learning_windows (the smoke run in `make test` uses 8).
# Prints Markdown tables (docs/benchmarks.md, "Ransomware detection").
set -euo pipefail
B=${1:?usage: anomaly_bench.sh BUILD_DIR [RUNS] [QUIET_S] [GB] [LEARN]}
RUNS=${2:-20} QUIET=${3:-600} GB=${4:-1} LEARN=${5:-30}
LG="$B/loadgen/cdp-loadgen"
COST="$B/bench/anomaly_cost"
for p in "$LG" "$COST" python3 curl; do
  command -v "$p" >/dev/null || { echo "missing: $p" >&2; exit 2; }
done
W=$(mktemp -d /tmp/cdp-anomaly-bench-XXXXXX)
CLUSTER=
cleanup() {
  [ -n "$CLUSTER" ] && kill "$CLUSTER" 2>/dev/null && wait "$CLUSTER" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
TCK=$(getconf CLK_TCK)

up() {  # up NAME [--agent-set K=V ...]: starts a cluster, sources its endpoints
  local name=$1
  shift
  "$LG" cluster --build "$B" --dir "$W/$name" --volume-size 1GiB --env-file "$W/$name.env" \
    --agent-set "anomaly.learning_windows=$LEARN" "$@" >"$W/$name.out" 2>"$W/$name.err" &
  CLUSTER=$!
  for _ in $(seq 1 600); do [ -s "$W/$name.env" ] && break; sleep 0.1; done
  [ -s "$W/$name.env" ] || { cat "$W/$name.err" >&2; exit 1; }
  # shellcheck disable=SC1090
  source "$W/$name.env"
  SCHEME=http
  if [ -n "${CDP_TLS_CA:-}" ]; then SCHEME=https; fi
  AGENT_PID=$CDP_AGENT_PID
}
down() {
  kill "$CLUSTER"
  wait "$CLUSTER" 2>/dev/null || true
  CLUSTER=
}
status_field() {  # status_field URL TOKEN_FILE FIELD: the first volume's FIELD
  curl -sf ${CDP_TLS_CA:+--cacert "$CDP_TLS_CA"} -H "Authorization: Bearer $(cat "$2")" "$1/status" |
    python3 -c "import json,sys; print(json.load(sys.stdin)['volumes'][0]['$3'])"
}
anomalies() { status_field "$SCHEME://$CDP_AGENT_CONTROL" "$CDP_AGENT_TOKEN_FILE" anomalies; }
churn() {  # churn RATE_MBS SECONDS COMPRESSIBILITY PATTERN SEED
  "$LG" churn --target "$CDP_NBD_URI" --rate "$1" --duration "$2" --compressibility "$3" --pattern "$4" \
    --seed "$5" --io-size 64KiB --flush-every 4MiB --json >/dev/null
}

# --- 1. detection delay ---
up detect
delays=()
for i in $(seq 1 "$RUNS"); do
  before=$(anomalies)
  # The first run learns (LEARN windows); later ones outlast the hold-off.
  if [ "$i" = 1 ]; then churn 4 $(( LEARN + 8 )) 0.75 random "$i"; else churn 4 65 0.75 random "$i"; fi
  t0=$(date +%s.%N)
  churn 20 12 0 random "$((1000 + i))" &
  ATTACK=$!
  delay=none
  for _ in $(seq 1 300); do
    if [ "$(anomalies)" -gt "$before" ]; then
      delay=$(python3 -c "import time; print(f'{time.time() - $t0:.2f}')")
      break
    fi
    sleep 0.05
  done
  wait "$ATTACK"
  delays+=("$delay")
  echo "run $i: detection delay $delay s" >&2
done
mt_anomalies=$(curl -sf ${CDP_TLS_CA:+--cacert "$CDP_TLS_CA"} -H "Authorization: Bearer $(cat "$CDP_MT_TOKEN_FILE")" \
  "$SCHEME://$CDP_MT_CONTROL/v1/anomalies?volume=$CDP_VOLUME&tenant=$CDP_TENANT" |
  python3 -c "import json,sys; print(len(json.load(sys.stdin)['anomalies']))" || echo "?")

# --- 2. false positives over the workload profiles, no switch ---
fp0=$(anomalies)
slice=$(( QUIET / 6 ))
[ "$slice" -ge 1 ] || slice=1
churn 3 "$slice" 0.75 seq 11
churn 3 "$slice" 0.5 random 12
churn 3 "$slice" 0.25 zipf:0.99 13
churn 2 "$slice" 0.75 zipf:0.9 14
churn 10 "$slice" 0.75 random 15  # a burst of compressible data at 5x the last
churn 2 "$slice" 0.75 seq 16
false_positives=$(( $(anomalies) - fp0 ))
down

# --- 3. CPU per GB, detection on and off, then the detector alone ---
cpu_run() {  # cpu_run NAME [agent-set...] -> prints "cpu_s bytes"
  up "$@" >&2
  local c0 c1 bytes
  c0=$(awk '{print $14 + $15}' "/proc/$AGENT_PID/stat")
  local secs
  secs=$(python3 -c "print(max(1, round($GB * 1000 / 100)))")
  churn 100 "$secs" 0.75 random 77
  c1=$(awk '{print $14 + $15}' "/proc/$AGENT_PID/stat")
  bytes=$(status_field "$SCHEME://$CDP_AGENT_CONTROL" "$CDP_AGENT_TOKEN_FILE" captured_bytes)
  down
  echo "$(( c1 - c0 )) $bytes"
}
read -r on_ticks on_bytes < <(cpu_run cpu-on)
read -r off_ticks off_bytes < <(cpu_run cpu-off --agent-set anomaly.enabled=false)

python3 - "$TCK" "$on_ticks" "$on_bytes" "$off_ticks" "$off_bytes" "$RUNS" "$QUIET" "$false_positives" \
  "$mt_anomalies" "${delays[@]}" <<'PY'
import statistics, sys
tck, on_t, on_b, off_t, off_b = (float(x) for x in sys.argv[1:6])
runs, quiet, fp, mt = sys.argv[6], sys.argv[7], sys.argv[8], sys.argv[9]
d = sys.argv[10:]
got = [float(x) for x in d if x != "none"]
print("| runs | detected | delay p50 (s) | delay max (s) | suspect-clean points at the MT |")
print("|---|---|---|---|---|")
p50 = f"{statistics.median(got):.2f}" if got else "-"
mx = f"{max(got):.2f}" if got else "-"
print(f"| {runs} | {len(got)} | {p50} | {mx} | {mt} |")
print()
print(f"False positives over {quiet} s of loadgen profiles with no switch: {fp}")
print()
on = on_t / tck / (on_b / 1e9)
off = off_t / tck / (off_b / 1e9)
print("| agent, mixed churn at 100 MB/s | GB captured | agent CPU s | agent CPU s/GB |")
print("|---|---|---|---|")
print(f"| detection on | {on_b/1e9:.2f} | {on_t/tck:.2f} | {on:.3f} |")
print(f"| detection off | {off_b/1e9:.2f} | {off_t/tck:.2f} | {off:.3f} |")
print(f"| difference | | | {on - off:+.3f} |")
PY
echo
"$COST" "$GB"

# STRICT=1 (the smoke run in `make test`): every run detected, each kept at
# the MT, no false positive; else exit 1.
if [ "${STRICT:-0}" = 1 ]; then
  for d in "${delays[@]}"; do [ "$d" != none ] || { echo "STRICT: a run was not detected" >&2; exit 1; }; done
  [ "$false_positives" = 0 ] || { echo "STRICT: $false_positives false positive(s)" >&2; exit 1; }
  [ "$mt_anomalies" = "$RUNS" ] || { echo "STRICT: the MT kept $mt_anomalies anomalies, not $RUNS" >&2; exit 1; }
fi
