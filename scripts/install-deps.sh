#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages OpenCDP needs, asking apt only for what is missing.
# As root it installs them; otherwise it prints the exact command to run.
# --check: only print what is missing (exit 1), never touch apt.
set -euo pipefail

# Build: compiler, CMake and the libraries of DESIGN.md.
# Test: real NBD clients (qemu-utils; libnbd-bin, which ships nbdinfo, nbdcopy and
# nbdfuse; nbdkit; libnbd-dev for bench/export_bench; python3-libnbd for e2e/libnbd_checks.py), fio, strace (bench/export_profile.sh), time (the CPU of a copy in bench/restore_bench.sh), e2fsprogs, rsync; systemd for systemd-analyze (the units' test);
# clang and its libFuzzer runtime for the fuzz.* tests (cmake/fuzz_tests.cmake); help2man
# (man pages), lintian and adduser for the Debian packages and their test (cmake/packaging.cmake);
# prometheus for promtool (the alert rules' test, e2e/monitoring_test.cc); chromium and
# chromium-driver (the dashboard's test in headless Chromium, e2e/dashboard_test.cc); ceph-mon, ceph-osd and
# ceph-common (the single-node test cluster of scripts/ceph-micro.sh) and librbd-dev/librados-dev (storage/,
# the librbd backend). Every entry is a real package name, so a
# machine that has them all never reaches apt (bookworm has no package "nbdfuse").
PACKAGES=(
  build-essential cmake pkg-config
  libboost1.81-dev libboost-json1.81-dev libboost-program-options1.81-dev
  libspdlog-dev libfmt-dev libsqlite3-dev libzstd-dev liblz4-dev libxxhash-dev libssl-dev
  catch2 libbenchmark-dev
  zstd lz4 qemu-utils libnbd-bin libnbd-dev python3-libnbd nbdkit fio strace time e2fsprogs rsync iproute2 util-linux curl
  systemd
  clang libclang-rt-14-dev
  help2man lintian adduser
  prometheus
  chromium chromium-driver
  ceph-mon ceph-osd ceph-common librbd-dev librados-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then  # report only: what `make` would ask apt for
  echo "missing Debian packages: ${missing[*]}"
  exit 1
fi

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "OpenCDP needs these Debian packages: ${missing[*]}" >&2
  echo "Run as root:  apt-get update && $cmd" >&2
  exit 1
fi

echo "Installing missing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends "${missing[@]}"
