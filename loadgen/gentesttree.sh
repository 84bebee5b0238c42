#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gentesttree.sh: the seed's gentesttree.bat loop (seeds/004, appendix A) for OpenCDP.
#
#   :loop1
#   GenerateTestTree.exe 0 10 8 C:\temp1      -> cdp-loadgen tree --mode write --size-mb 10 --seed 8 --dir DIR
#   ping -n 5 localhost                       -> sleep PAUSE (5 pings = about 4 s)
#   rm.exe -rf C:\temp1                       -> rm -rf DIR
#   goto loop1
#
# usage: gentesttree.sh [-s SIZE_MB] [-S SEED] [-d DIR] [-p PAUSE_S] [-n ITERATIONS]
#                       [-c COMPRESSIBILITY] [-b CDP_LOADGEN]
#   -s  size written per iteration, MiB (default 10; the seed stepped 1..250)
#   -S  random seed (default 8, as in the seed)
#   -d  directory, on a file system over the protected volume (default /tmp/temp1)
#   -p  pause between writing and deleting, seconds (default 4)
#   -n  iterations; 0 = loop until interrupted (default 0)
#   -c  compressibility of the data, 0..1 (default 0.75)
#   -b  the cdp-loadgen binary (default: cdp-loadgen on PATH)
# Each iteration prints one line: iteration, bytes written, seconds spent writing.
set -euo pipefail

size=10 seed=8 dir=/tmp/temp1 pause=4 iterations=0 comp=0.75 bin=cdp-loadgen
usage() { sed -n '10,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while getopts "s:S:d:p:n:c:b:h" opt; do
  case "$opt" in
    s) size=$OPTARG ;; S) seed=$OPTARG ;; d) dir=$OPTARG ;; p) pause=$OPTARG ;;
    n) iterations=$OPTARG ;; c) comp=$OPTARG ;; b) bin=$OPTARG ;; *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || usage
case "$iterations" in ''|*[!0-9]*) echo "gentesttree.sh: -n needs a whole number" >&2; exit 2 ;; esac
if [ -z "$dir" ] || [ "$dir" = "/" ]; then echo "gentesttree.sh: refusing to use '$dir'" >&2; exit 2; fi

i=0
while [ "$iterations" -eq 0 ] || [ "$i" -lt "$iterations" ]; do
  i=$((i + 1))
  start=$(date +%s.%N)
  "$bin" tree --mode write --size-mb "$size" --seed "$seed" --dir "$dir" --compressibility "$comp" >/dev/null
  end=$(date +%s.%N)
  echo "iteration $i: wrote $size MiB to $dir in $(awk "BEGIN{printf \"%.3f\", $end - $start}") s"
  sleep "$pause"
  rm -rf -- "$dir"
done
