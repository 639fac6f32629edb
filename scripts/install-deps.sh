#!/usr/bin/env bash
# Installs every Debian package ftrun's build, tests, demo and benchmarks need
# (Debian 12 or 13: the same names). The Python packages (torch, DeepSpeed,
# pytest, clang-format, ...) come from requirements.txt into .venv/
# (scripts/venv.sh), not from Debian.
# Safe to run again: apt-get skips what is already there. apt-get's output
# goes to build/logs/install-deps.log (shown if it fails; FTRUN_VERBOSE=1
# shows it as it happens).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phase.sh
pkgs=(
  build-essential cmake pkg-config ninja-build ccache
  libucx-dev ucx-utils libopenmpi-dev openmpi-bin
  libyaml-cpp-dev libspdlog-dev catch2 libisal-dev libxxhash-dev liburing-dev
  libcli11-dev nlohmann-json3-dev pybind11-dev python3-dev
  fio
  libssl-dev nftables iputils-ping iproute2 procps
  libnetfilter-queue-dev libmnl-dev openssh-server openssh-client
  python3-pip python3-setuptools python3-wheel python3-venv
  python3-numpy  # the installed module's Client.load gives numpy arrays (tests/install: the system python3)
  prometheus-cpp-dev prometheus
  libcurl4-openssl-dev etcd-server
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "ftrun: packages: all ${#pkgs[@]} present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
apt_install() {
  $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
}
phase "installing Debian packages (${#missing[@]} missing; apt-get)" install-deps.log apt_install
