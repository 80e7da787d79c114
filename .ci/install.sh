#!/usr/bin/env bash
# Install everything the project and its tests need on a fresh Debian 12 or Ubuntu 24.04
# machine, idempotently: Debian's OpenSSH server and client (real sshd hosts in the tests),
# GNU Go (an independent engine the rules are checked against), iproute2 + nftables
# (network-namespace hosts and link faults), chromium (the run page in a headless browser),
# node + npm (Sabaki's SGF parser reads our SGF files), python3-venv; then, in the virtual
# environment .venv (the system's pip refuses system-wide installs, PEP 668), torch==2.13.0
# from PyTorch's CPU wheel index FIRST (the torch wheel on PyPI pulls the CUDA libraries;
# TORCH_INDEX_URL names another index, e.g. a local mirror), then this project with its test
# extras. apt-get needs root or sudo; without them, or without apt-get, it says what to install.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(openssh-server openssh-sftp-server openssh-client gnugo iproute2 nftables procps chromium
          python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# node and npm from any source (a NodeSource node carries its own npm)
{ command -v node && command -v npm; } >/dev/null 2>&1 || missing+=(nodejs npm)
if ((${#missing[@]})); then
  if ! command -v apt-get >/dev/null; then
    echo "install.sh: no apt-get here (it expects Debian 12 or Ubuntu 24.04); install these" \
      "with your system's package manager, then run it again: ${missing[*]}" >&2
    exit 1
  elif [[ $(id -u) == 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  elif command -v sudo >/dev/null; then
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "install.sh: needs root or sudo for apt-get; as root, run:" \
      "apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

[[ -x .venv/bin/python3 ]] || python3 -m venv .venv
pip=(.venv/bin/python3 -m pip install -q --disable-pip-version-check)
# a CPU build from the indexes pip is configured with (a local mirror has one; PyPI has none
# and says so at once), else PyTorch's CPU index
if [[ -n ${TORCH_INDEX_URL:-} ]] || ! "${pip[@]}" 'torch==2.13.0+cpu' 2>/dev/null; then
  "${pip[@]}" torch==2.13.0 --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
fi
"${pip[@]}" -e '.[test]'
.venv/bin/python3 - <<'PY'
import torch, paramiko, numba, pyspiel, sgfmill, prometheus_client, tensorboard  # noqa: F401  (fail here, not mid-suite)
print(f"installed: torch {torch.__version__}, paramiko {paramiko.__version__}, numba {numba.__version__}")
PY
# Sabaki's own SGF parser (npm), which the tests read our SGF files with: exactly the
# versions and hashes of tests/js/package-lock.json (`npm ci` refuses a lock that disagrees)
npm ci --prefix tests/js --no-audit --no-fund --silent >/dev/null
node -e 'require("./tests/js/node_modules/@sabaki/sgf"); console.log("node", process.version, "@sabaki/sgf ok")'
/usr/sbin/sshd -V 2>&1 | head -n 1
/usr/games/gnugo --version | head -n 1
