#!/usr/bin/env bash
# Installs the Debian packages zero-workbench needs, where they are missing.
set -euo pipefail
pkgs=(libopenmpi-dev openmpi-bin libopenblas-dev libaio-dev libcmocka-dev libjansson-dev libboost-context-dev gnuplot-nox make gcc g++ procps iproute2 util-linux)
# for make test alone, no binary uses it: the one-node Slurm of test_slurm
# (scripts/slurm-local.sh; munge comes with it). Kept off the line above,
# which offline-deps.sh reads: a machine with a Slurm of its own keeps it.
pkgs+=(slurm-wlm)
# `install-deps.sh fuzz`: what make fuzz needs besides (clang, its libFuzzer
# and sanitizer runtimes, its OpenMP)
if [ "${1:-}" = fuzz ]; then pkgs=(clang libclang-rt-dev libomp-dev); fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all present (${pkgs[*]})"
    exit 0
fi
echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
echo "deps: installed ${missing[*]}"
