#!/usr/bin/env bash
# Builds ftrun and runs its C++ unit and transport tests on another Debian
# release than this machine's, in a debootstrap of it (as root):
#
#   scripts/debian-check.sh trixie      # Debian 13 (on a Debian 12 machine)
#   scripts/debian-check.sh bookworm    # Debian 12 (on a Debian 13 machine)
#
# The release's root file system goes to build/debian-RELEASE/ (made once:
# debootstrap, then scripts/install-deps.sh inside it, so the package list is
# checked on that release too); the checkout is bind-mounted at /src and built
# into /src/build-RELEASE/ with the release's own compilers and libraries
# (Catch2 2 or 3, fmt 9 or 10, yaml-cpp 0.7 or 0.8, UCX 1.13 or 1.18). The
# Python module is left out: the project's torch wheel is for this machine's
# CPython 3.11, not the release's python3. Logs: build/logs/debian-RELEASE-*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phase.sh
release=${1:?usage: scripts/debian-check.sh RELEASE (e.g. trixie or bookworm)}
root=$PWD/build/debian-$release
if [ "$(id -u)" -ne 0 ]; then
  echo "debian-check: needs root (debootstrap, chroot, mount)" >&2
  exit 2
fi
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() {  # bind SRC DST: mounts SRC (and what is mounted under it) at DST until this script ends
  mkdir -p "$2"
  mount --rbind "$1" "$2"
  mounted+=("$2")
}

if [ ! -x "$root/usr/bin/apt-get" ]; then
  phase "debootstrap $release into $root" "debian-$release-debootstrap.log" \
    debootstrap --variant=minbase "$release" "$root" http://deb.debian.org/debian
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"  # packages start no services in the chroot
chmod +x "$root/usr/sbin/policy-rc.d"
bind /proc "$root/proc"
bind /dev "$root/dev"  # (with /dev/shm: UCX's shared memory)
bind /sys "$root/sys"  # (UCX lists its network devices there)
bind "$PWD" "$root/src"
phase "installing $release's packages (scripts/install-deps.sh in the chroot)" "debian-$release-deps.log" \
  chroot "$root" env FTRUN_LOG_DIR=/tmp /src/scripts/install-deps.sh
echo "ftrun: $release: Debian $(cat "$root/etc/debian_version"), $(chroot "$root" c++ --version | head -1)"
build=build-$release
phase "configuring /src/$build on $release (cmake)" "debian-$release-configure.log" \
  chroot "$root" cmake -S /src -B "/src/$build" -G Ninja -DFTRUN_BUILD_PYTHON=OFF -DFTRUN_WITH_CUDA=OFF
phase "building /src/$build on $release (ninja)" "debian-$release-build.log" \
  chroot "$root" ninja -C "/src/$build" ftrun_unit_tests ftrun_transport_tests transport_peer transport_rogue \
  ftrun-agent ftrun-runner
phase "running the unit tests on $release" "debian-$release-unit.log" chroot "$root" "/src/$build/tests/ftrun_unit_tests"
phase "running the transport tests on $release" "debian-$release-transport.log" \
  chroot "$root" env UCX_NET_DEVICES=lo "/src/$build/tests/ftrun_transport_tests"
echo "ftrun: $release: built; unit and transport tests passed ($(grep -h 'All tests passed' \
  "$FTRUN_LOG_DIR/debian-$release-unit.log" "$FTRUN_LOG_DIR/debian-$release-transport.log" | tr '\n' ' '))"
