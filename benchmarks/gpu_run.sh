#!/usr/bin/env bash
# The GPU suite on the H100 machine, within its 10-minute call limit.
#
#   bash benchmarks/gpu_run.sh quick [ARGS...]   # 6 representative models, 3 columns, one call
#   bash benchmarks/gpu_run.sh 3/10 [ARGS...]    # shard 3 of 10 of the whole suite
#   bash benchmarks/gpu_run.sh tests             # the GPU tests (pytest -m gpu)
#   bash benchmarks/gpu_run.sh micro             # bandwidth and reduce-overhead microbenchmarks
#
# The repository arrives as a copy without kiln installed, so every packages/*/src goes on
# PYTHONPATH. Results land in $OUT/<run>/ (results.csv, summary.md, speedups.png, meta.json,
# logs/); compile caches stay outside $OUT. The run stops itself after $BUDGET seconds (default
# 530) and records what it could not finish, so the call returns within its limit. ARGS go to
# `python -m benchmarks` (e.g. --mode training, --dtype amp, --backends eager,torch_compile).
# Merge shards afterwards with: python -m benchmarks.report DIR1 DIR2 ... --out DIR
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
for src in "$ROOT"/packages/*/src; do
    PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"
done
export PYTHONPATH="$ROOT:$PYTHONPATH"

WHAT="${1:-quick}"
shift || true
OUT="${OUT:-$ROOT/bench-results}"
PY="${PYTHON:-python3}"
QUICK="resnet50 vit_base_patch16_224 hf_bert hf_llama mlp_layernorm_gelu attention_block"

if [[ "$WHAT" == tests ]]; then
    status=0  # each package's tests in their own run: their conftests set different things up
    for dir in packages/*/tests tests; do
        "$PY" -m pytest -m gpu -q -p no:cacheprovider "$dir" "$@" || [[ $? == 5 ]] || status=1
    done
    exit $status
elif [[ "$WHAT" == micro ]]; then
    exec "$PY" benchmarks/gpu_micro.py "$@"
elif [[ "$WHAT" == quick ]]; then
    select=(--models $QUICK --no-warm)
    name=quick
    BACKENDS="${BACKENDS:-eager,kiln,torch_compile}"
else
    select=(--shard "$WHAT")
    name="shard-${WHAT/\//-of-}"
fi

"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")'
exec "$PY" -m benchmarks --device cuda --backends "${BACKENDS:-eager,kiln,aot_eager,torch_compile}" \
    "${select[@]}" --out "$OUT/$name" --cache-dir "${TMPDIR:-/tmp}/kiln-bench-cache" \
    --budget "${BUDGET:-530}" --timeout "${TIMEOUT:-240}" --no-progress "$@"
