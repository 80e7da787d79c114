#!/usr/bin/env bash
# Install everything the project and its tests need on a fresh Debian machine, idempotently:
# Debian's OpenSSH server and client (real sshd hosts in the tests), GNU Go (an independent
# engine the rules are checked against), iproute2 + nftables (network-namespace hosts and link
# faults), chromium (the run page in a headless browser), node + npm (Sabaki's SGF parser
# reads our SGF files), then torch==2.13.0 FIRST (a bare `torch` would pull the newest CUDA
# build), then this project with its test extras. apt-get needs root; without root it says what to install.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(openssh-server openssh-sftp-server openssh-client gnugo iproute2 nftables procps chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# node and npm from any source (a NodeSource node carries its own npm)
{ command -v node && command -v npm; } >/dev/null 2>&1 || missing+=(nodejs npm)
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  elif command -v sudo >/dev/null; then
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "install.sh: please install as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

python3 -m pip install -q --disable-pip-version-check torch==2.13.0
python3 -m pip install -q --disable-pip-version-check -e '.[test]'
python3 - <<'PY'
import torch, paramiko, numba, pyspiel, sgfmill, prometheus_client, tensorboard  # noqa: F401  (fail here, not mid-suite)
print(f"installed: torch {torch.__version__}, paramiko {paramiko.__version__}, numba {numba.__version__}")
PY
# Sabaki's own SGF parser (npm), which the tests read our SGF files with: exactly the
# versions and hashes of tests/js/package-lock.json (`npm ci` refuses a lock that disagrees)
npm ci --prefix tests/js --no-audit --no-fund --silent >/dev/null
node -e 'require("./tests/js/node_modules/@sabaki/sgf"); console.log("node", process.version, "@sabaki/sgf ok")'
/usr/sbin/sshd -V 2>&1 | head -n 1
/usr/games/gnugo --version | head -n 1
