#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# plan_bench.sh: does `cdp-loadgen plan` predict the RPO a link gives? (issue #44)
#
# usage: plan_bench.sh BUILD_DIR [RATE_MBIT=20] [ONE_WAY_DELAY_MS=12.5]
#                      [SCENARIOS="steady burst3 sawtooth burst2"]
#
# One deployment as the product ships (loadgen/wan_deploy.sh: TLS, tokens,
# zstd-1, the master target behind `cdp-loadgen wanem` at RATE_MBIT), whose
# protected volume is a loop device. Per scenario, one churn schedule runs
# through the agent's NBD tap, and two things watch it:
#   - `cdp-loadgen profile` on the loop device (tracefs, 1 s rows): what the
#     block layer saw the agent write, as a customer's profile would record it
#     before the agent was installed;
#   - the deployment's RPO lag sampled four times a second, exactly as
#     bench/rpo_bench.sh does (wan_lag: the age of the oldest write not yet
#     durable at the master target).
# Then `plan --profile P --link G --compression R`, and its worst lag on the
# link is set beside the worst lag measured. R is the PS's own raw/wire ratio
# over the scenario; G is what the link carries of TCP payload: RATE_MBIT x
# 1448 / 1514 (a full 1500-byte Ethernet frame carries 1448 bytes of it with
# TCP timestamps), as docs/loadgen.md tells an operator to give plan. The two lags have the same maximum for a FIFO
# link at a constant rate (docs/loadgen.md, "plan against the pipeline").
#
# Scenarios (u = the share of the link the step's churn needs: half of each
# written block is random, zstd-1 halves it, so the change rate is 2u x link):
#   steady    30 s at u 0.7                 (the model: no lag)
#   burst2    8 s at 0.3, 10 s at 2.0, 25 s at 0.3
#   burst3    8 s at 0.3, 5 s at 3.0, 25 s at 0.3
#   sawtooth  4 x (5 s at 1.5, 5 s at 0.5), then 15 s at 0.3
#   smoke     4 s at 0.3, 6 s at 2.0, 12 s at 0.3   (make test)
#
# Tolerance (docs/loadgen.md): measured worst lag within
#   plan - 0.5 s  ..  plan x 1.15 + 1.0 s.
# Prints a Markdown table; exits 1 when a scenario is outside it.
# Root (losetup, tracefs, network namespaces).
set -euo pipefail
BUILD=${1:?usage: plan_bench.sh BUILD_DIR [RATE_MBIT] [DELAY_MS] [SCENARIOS]}
RATE=${2:-20} DELAY=${3:-12.5} SCENARIOS=${4:-"steady burst3 sawtooth burst2"}
for p in losetup python3; do command -v "$p" >/dev/null || { echo "missing: $p" >&2; exit 2; }; done
IMG=$(mktemp /tmp/cdp-plan-bench-XXXXXX.img)
LOOP="" PROF=""
cleanup() {
  [ -z "$PROF" ] || kill "$PROF" 2>/dev/null || true
  if declare -F wan_down >/dev/null; then wan_down; fi
  [ -z "$LOOP" ] || losetup -d "$LOOP" 2>/dev/null || true
  rm -f "$IMG"
}
trap cleanup EXIT
truncate -s 1G "$IMG"
LOOP=$(losetup --find --show "$IMG")
# shellcheck source=loadgen/wan_deploy.sh
source "$(dirname "$0")/../loadgen/wan_deploy.sh"
WAN_VOLUME_IMAGE=$LOOP wan_up "$BUILD" "$RATE" "$DELAY" zstd 1
trap cleanup EXIT  # wan_up set its own
link_mbs=$(awk -v r="$RATE" 'BEGIN {print r / 8}')
goodput=$(awk -v r="$RATE" 'BEGIN {printf "%.3f", r * 1448 / 1514}')  # Mbit/s of TCP payload

schedule() {  # SCENARIO -> "seconds:u" steps
  case $1 in
    steady) echo "30:0.7" ;;
    burst2) echo "8:0.3 10:2.0 25:0.3" ;;
    burst3) echo "8:0.3 5:3.0 25:0.3" ;;
    sawtooth) echo "5:1.5 5:0.5 5:1.5 5:0.5 5:1.5 5:0.5 5:1.5 5:0.5 15:0.3" ;;
    smoke) echo "4:0.3 6:2.0 12:0.3" ;;
    *) echo "unknown scenario $1" >&2; return 1 ;;
  esac
}
run_schedule() {  # STEPS... (each step a new churn with its own seed: new blocks)
  local seed=1 step
  for step in "$@"; do
    $A "$LG" churn --target "nbd+unix:///v?socket=$WAN_DIR/agent/nbd.sock" --rate "$(awk -v u="${step#*:}" -v l="$link_mbs" 'BEGIN {print 2 * u * l}')" \
      --duration "${step%%:*}" --pattern random --io-size 64KiB --compressibility 0.5 --flush-every 1MiB --seed $((seed++)) \
      --json >>"$WAN_DIR/churn.json" 2>/dev/null
  done
}

echo "link $RATE Mbit/s ($goodput Mbit/s of TCP payload given to plan), RTT $(awk -v d="$DELAY" 'BEGIN {print 2 * d}') ms; the volume is $LOOP"
echo
echo "| scenario | churned MB | profiled MB | zstd-1 ratio | plan: worst lag s | measured: worst lag s | measured p99 s | within |"
echo "|---|---:|---:|---:|---:|---:|---:|---|"
fail=0
for sc in $SCENARIOS; do
  read -r -a steps <<<"$(schedule "$sc")"
  wan_drain
  : >"$WAN_DIR/churn.json"
  : >"$WAN_DIR/lag"
  r0=$(ps_metric cdp_ps_raw_bytes_out_total) w0=$(ps_metric cdp_ps_bytes_out_total)
  "$LG" profile --device "$LOOP" --interval 1s --duration 10m --out "$WAN_DIR/profile.csv" 2>"$WAN_DIR/profile.log" &
  PROF=$!
  for _ in $(seq 100); do [ -s "$WAN_DIR/profile.csv" ] && break; sleep 0.1; done  # its header: tracing is on
  run_schedule "${steps[@]}" &
  cpid=$!
  while kill -0 "$cpid" 2>/dev/null; do wan_lag >>"$WAN_DIR/lag"; echo >>"$WAN_DIR/lag"; sleep 0.25; done
  wait "$cpid"
  # The backlog drains; its lag keeps being sampled (the worst lag can come at the end).
  for _ in $(seq 1200); do
    l=$(wan_lag)
    echo "$l" >>"$WAN_DIR/lag"
    [ "$l" = "0.000" ] && [ "$(ps_metric cdp_ps_backlog_bytes)" = "0.000000" ] && break
    sleep 0.25
  done
  kill -TERM "$PROF"
  wait "$PROF" || { echo "profile failed:" >&2; cat "$WAN_DIR/profile.log" >&2; exit 1; }
  PROF=""
  r1=$(ps_metric cdp_ps_raw_bytes_out_total) w1=$(ps_metric cdp_ps_bytes_out_total)
  ratio=$(awk -v r="$r1" -v r0="$r0" -v w="$w1" -v w0="$w0" 'BEGIN {printf "%.4f", (r - r0) / (w - w0)}')
  "$LG" plan --profile "$WAN_DIR/profile.csv" --link "$goodput" --compression "$ratio" --format json >"$WAN_DIR/plan.json"
  python3 - "$sc" "$WAN_DIR/churn.json" "$WAN_DIR/profile.csv" "$WAN_DIR/plan.json" "$WAN_DIR/lag" "$ratio" <<'PY' || fail=1
import json, sys
sc, churn, prof, plan, lag, ratio = sys.argv[1:]
churned = sum(json.loads(l)["bytes"] for l in open(churn) if l.strip())
rows = [l.split(",") for l in open(prof) if l[:1].isdigit()]
profiled = sum(int(r[1]) for r in rows)
p = json.load(open(plan))
planned = p["link"]["lag_max_s"]
lags = sorted(float(x) for x in open(lag).read().split())
worst = lags[-1]
p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
lo, hi = planned - 0.5, planned * 1.15 + 1.0
ok = lo <= worst <= hi and abs(profiled - churned) <= 0.02 * churned and p.get("lost_events", 0) == 0
print(f"| {sc} | {churned / 1e6:.1f} | {profiled / 1e6:.1f} | {float(ratio):.3f} | {planned:.2f} | {worst:.2f} | {p99:.2f} | "
      f"{'yes' if ok else 'NO'} ({lo:.2f}..{hi:.2f}) |")
if not ok:
    sys.exit(1)
PY
done
exit $fail
