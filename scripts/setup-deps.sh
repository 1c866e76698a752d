#!/bin/sh
# Installs the Debian packages ferry builds and tests with, when they are missing.
# Idempotent: does nothing when all are present. Needs root to install; otherwise it names
# the missing packages and exits non-zero.
set -eu

PACKAGES="build-essential cmake pkg-config libsqlite3-dev sqlite3 libcmocka-dev libopenblas-dev \
libcjson-dev zlib1g-dev gnuplot-nox doxygen python3-numpy python3-jsonschema chromium libopenmpi-dev openmpi-bin"

missing=""
for p in $PACKAGES; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done

[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "ferry: missing Debian packages:$missing" >&2
  echo "ferry: install them with: sudo apt-get install -y$missing" >&2
  exit 1
fi

echo "ferry: installing Debian packages:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "ferry: packages installed"
