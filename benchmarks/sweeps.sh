#!/usr/bin/env bash
# The long CPU correctness sweeps spread over a many-core machine (such as the GPU machine's CPU
# cores) so that each fits one 10-minute call:
#
#   bash benchmarks/sweeps.sh opinfo MODE WORKERS [OPINFO ARGS...]  # python -m opinfo, one mode
#   bash benchmarks/sweeps.sh fuzz PROCS EXAMPLES SEED              # PROCS fuzzers side by side,
#                                                                   # seeds SEED, SEED+1, ...
#
# Every op's result (opinfo -v) and every fuzzer's progress and summary go to $OUT/sweeps/, so a
# run stopped by its time limit still shows what it covered; `--json` results are written there
# too. A fuzz run packs its logs and findings into one archive, $OUT/sweeps/fuzz.tgz, so that the
# call returns it whatever the number of fuzzers. Each command stops itself after $BUDGET seconds
# (default 540; a process still running 30 s later is killed): a fuzzer stopped by SIGTERM prints
# its summary, and an OpInfo sweep's log lists the ops it finished (rerun the rest with `--ops`).
# A fuzzer that died leaves the program it was running in its findings folder
# (fuzz-findings-SEED/running/). The repository may arrive without kiln installed, so every
# packages/*/src goes on PYTHONPATH; EXTRA_PYTHONPATH adds more (e.g. hypothesis and expecttest
# where pip can't reach).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
path="$ROOT:$ROOT/tests${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}"
for src in "$ROOT"/packages/*/src; do
    path="$src:$path"
done
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/bench-results}/sweeps"
BUDGET="${BUDGET:-540}"
mkdir -p "$OUT"

what="${1:?opinfo or fuzz}"
shift
if [[ "$what" == opinfo ]]; then
    mode="${1:?mode}" workers="${2:?workers}"
    shift 2
    timeout -k 30 "$BUDGET" "$PY" -m opinfo --mode "$mode" --workers "$workers" -v \
        --json "$OUT/opinfo-$mode.json" "$@" >"$OUT/opinfo-$mode.md" 2>"$OUT/opinfo-$mode.log"
elif [[ "$what" == fuzz ]]; then
    procs="${1:?procs}" examples="${2:?examples}" seed="${3:?seed}"
    pids=()
    for ((i = 0; i < procs; i++)); do
        s=$((seed + i))
        timeout -k 30 "$BUDGET" "$PY" -m fuzz.run --examples "$examples" --seed "$s" \
            --out "$OUT/fuzz-findings-$s" >"$OUT/fuzz-$s.log" 2>&1 &
        pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do
        wait "$pid" || status=1
    done
    grep -h "^done in\|^interrupted\|^FINDING" "$OUT"/fuzz-*.log || true
    for crashed in "$OUT"/fuzz-findings-*/running/repro_000.py; do  # left by a process that died
        [[ -e "$crashed" ]] && echo "CRASHED running ${crashed#"$OUT"/}" && status=1
    done
    (cd "$OUT" && tar czf fuzz.tgz fuzz-*.log fuzz-findings-* 2>/dev/null && rm -rf fuzz-*.log fuzz-findings-*) || true
    exit $status
else
    echo "usage: $0 opinfo MODE WORKERS [ARGS...] | fuzz PROCS EXAMPLES SEED" >&2
    exit 2
fi
