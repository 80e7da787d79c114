#!/usr/bin/env bash
# The GPU measurement on a machine lent for about 15 minutes (start-up included), as two
# commands of under 10 minutes each, rehearsed on a CPU box with --cpu-only:
#
#   bash benchmarks/gpu_loan.sh ceiling [--cpu-only]   # benchmarks/gpu_ceiling.py, ~5 min
#   bash benchmarks/gpu_loan.sh run [--cpu-only]       # benchmarks/gpu_run.py, ~6.5 min
#
# The machine needs torch, numpy, numba and matplotlib; what it lacks of paramiko, zstandard,
# watchdog and ruamel.yaml (and their needs) comes from the wheels in .whl/ (see
# docs/PERFORMANCE.md, "The GPU measurement in one command"), installed into a scratch folder
# on PYTHONPATH, with no network. Each step writes one archive, OUT/<step>.tgz (OUT is $OUT,
# else benchmarks/out/gpu_loan), so that the results come back as a single file: the
# ceiling's JSON lines and log, or the run folder the strength tool reads (generation 0, the
# newest models, config, metrics, progress.png) with gpu_run.json and start_main's log.
# Times: CEILING_S (default 280) is the ceiling's budget, RUN_HOURS (0.1) and
# RUN_DEADLINE_S (460) the run's length and the wall time its command ends within.
set -uo pipefail
cd "$(dirname "$0")/.."
step="${1:-}"
shift || true
case "$step" in
  ceiling|run) ;;
  *) echo "usage: bash benchmarks/gpu_loan.sh ceiling|run [--cpu-only]" >&2; exit 2 ;;
esac
out="${OUT:-benchmarks/out/gpu_loan}"
mkdir -p "$out"
work="$(mktemp -d)"
export PYTHONUNBUFFERED=1
if ! python3 -c "import paramiko, zstandard, watchdog, ruamel.yaml" 2>/dev/null; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "error: paramiko, zstandard, watchdog or ruamel.yaml missing and no wheels in .whl/" >&2
    exit 3
  fi
  python3 -m pip install -q --no-index --find-links .whl --no-compile --no-cache-dir \
    --target "$work/site" paramiko zstandard watchdog ruamel.yaml || exit 3
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# the benchmarks' child processes import the project from here (it is not pip-installed there)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

mkdir -p "$work/$step"
if [ "$step" = ceiling ]; then
  python3 benchmarks/gpu_ceiling.py --budget-s "${CEILING_S:-280}" --out "$work/ceiling" "$@" \
    2>&1 | tee "$work/ceiling/log.txt"
  rc=${PIPESTATUS[0]}
else
  python3 benchmarks/gpu_run.py --hours "${RUN_HOURS:-0.1}" --deadline "${RUN_DEADLINE_S:-460}" \
    --out "$work/run" "$@" 2>&1 | tee "$work/run/log.txt"
  rc=${PIPESTATUS[0]}
fi
tar -C "$work" -czf "$out/$step.tgz" "$step"
echo "$step: exit $rc, results in $out/$step.tgz"
exit "$rc"
