#!/usr/bin/env bash
# The GPU suite on the H100 machine, within its 10-minute call limit.
#
#   bash benchmarks/gpu_run.sh quick [ARGS...]   # 6 representative models, 3 columns, one call
#   bash benchmarks/gpu_run.sh 3/10 [ARGS...]    # shard 3 of 10 of the whole suite
#   bash benchmarks/gpu_run.sh 3/22 --models breadth --no-warm   # shard 3 of 22 of the breadth suite
#   bash benchmarks/gpu_run.sh gpus 1/22 --models breadth --no-warm  # shards from 1 of 22, one per GPU at a time
#   bash benchmarks/gpu_run.sh tests             # the GPU tests (pytest -m gpu)
#   bash benchmarks/gpu_run.sh micro             # bandwidth and reduce-overhead microbenchmarks
#   bash benchmarks/gpu_run.sh warm [ARGS...]    # warm start: benchmarks/warm_start.py
#   bash benchmarks/gpu_run.sh memcheck [tests|models] [MODEL...]  # compute-sanitizer memcheck
#   bash benchmarks/gpu_run.sh distributed [ARGS...]  # DDP/FSDP2 on 2 GPUs: benchmarks/distributed.py
#                                     # (SETUPS="ddp", COMPILERS="kiln eager": rows; fresh ranks each;
#                                     # REPEAT=3: each row three times, the median reported)
#
# memcheck runs the GPU tests of codegen_triton, tests/test_models_e2e.py and
# tests/test_gpu_memory_safety.py, then each MODEL (default: $MEMCHECK_MODELS below; `phi` is
# transformers' Phi, the others benchmarks/models entries at the cpu preset) for two calls in
# inference and two in training, each checked against eager (benchmarks/gpu_memcheck.py), every
# process under `compute-sanitizer --tool memcheck` with PyTorch's caching allocator off, so an
# access outside a tensor is an error rather than a read of its neighbour. Logs and summary.txt
# land in $OUT/memcheck/; exits 1 if any run failed. MEMCHECK_TIMEOUT: seconds per process.
# Everything takes longer than one 10-minute call: on the H200 the tests took 220 s and a
# model 10 to 140 s a process, so run `memcheck tests` and `memcheck models A B ...` apart.
#
# The repository arrives as a copy without kiln installed, so every packages/*/src goes on
# PYTHONPATH. Results land in $OUT/<run>/ (results.csv, summary.md, speedups.png, meta.json,
# logs/); compile caches stay outside $OUT. The run stops itself after $BUDGET seconds (default
# 530) and records what it could not finish, so the call returns within its limit. ARGS go to
# `python -m benchmarks` (e.g. --mode training, --dtype amp, --backends eager,torch_compile).
# Merge shards afterwards with: python -m benchmarks.report DIR1 DIR2 ... --out DIR
#
# `gpus FIRST/N` runs shards on every GPU of the machine at once, each GPU alone in its process
# (CUDA_VISIBLE_DEVICES) with its own compile caches: GPU g takes shards FIRST+g, FIRST+g+G, ...
# (G GPUs) of N, one after another while $BUDGET seconds last, each into $OUT/shard-S-of-N/.
# GPU_LIST="2 3" gives it those GPUs only (others stay free for another run at the same time).
# GPUs' timings are then of different cards: compare columns within a shard, as always.
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
elif [[ "$WHAT" == memcheck ]]; then
    MEMCHECK_MODELS="phi hf_llama hf_bert hf_gpt2 hf_t5_encoder vit_tiny_patch16_224 \
swin_tiny_patch4_window7_224 resnet18 attention_block mlp_layernorm_gelu"
    part="${1:-all}"
    shift || true
    models="${*:-$MEMCHECK_MODELS}"
    sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
    dir="$OUT/memcheck"
    mkdir -p "$dir"
    # every tensor its own cudaMalloc (else an access past a tensor lands in its segment
    # unseen), padding between allocations, compiles in this process (workers run no kernels)
    export PYTORCH_NO_CUDA_MEMORY_CACHING=1 KILN_TRITON_PARALLEL_COMPILE=0 PYTHONUNBUFFERED=1
    san=("$sanitizer" --tool memcheck --padding 512 --error-exitcode 99 --print-limit 20)
    status=0
    check() {  # NAME COMMAND...: one process under memcheck, its log and a summary line
        local name=$1 start=$SECONDS rc=0
        shift
        timeout "${MEMCHECK_TIMEOUT:-240}" "${san[@]}" "$@" >"$dir/$name.log" 2>&1 || rc=$?
        local summary
        summary="$(grep -m1 'ERROR SUMMARY' "$dir/$name.log" || echo 'no ERROR SUMMARY')"
        echo "$name: rc=$rc $((SECONDS - start))s ${summary#========= }" | tee -a "$dir/summary.txt"
        [[ $rc == 0 ]] || status=1
    }
    if [[ "$part" == all || "$part" == tests ]]; then
        check tests-codegen_triton "$PY" -m pytest -m gpu -q -p no:cacheprovider \
            packages/codegen_triton/tests/test_gpu.py -k "not cuda_graph"
        # a CUDA graph's capture may not cudaMalloc: these run over the caching allocator
        check tests-cuda_graphs env -u PYTORCH_NO_CUDA_MEMORY_CACHING "$PY" -m pytest -m gpu -q \
            -p no:cacheprovider packages/codegen_triton/tests/test_gpu.py \
            tests/test_gpu_memory_safety.py -k cuda_graph
        check tests-models "$PY" -m pytest -m gpu -q -p no:cacheprovider \
            tests/test_models_e2e.py tests/test_gpu_memory_safety.py -k "not cuda_graph"
    fi
    if [[ "$part" == all || "$part" == models ]]; then
        phi=(--layers 2 --batch 2 --seq 128 --hidden 256 --heads 4 --vocab 1024)
        for model in $models; do
            for mode in inference training; do
                extra=()
                [[ "$model" == phi ]] && extra=("${phi[@]}")
                check "$model-$mode" "$PY" benchmarks/gpu_memcheck.py "$model" --mode "$mode" \
                    --calls 2 "${extra[@]}"
            done
        done
    fi
    exit $status
elif [[ "$WHAT" == distributed ]]; then  # eager, torch.compile, Kiln under DDP and FSDP2 (NCCL)
    # fresh ranks per row (SETUPS x COMPILERS, REPEAT times, the compilers' order reversed on
    # every other repetition): a compiler's process-wide state stays out of the rows after it.
    # Each rank is bound to the CPUs of its GPU's NUMA node when torchrun can (the step is
    # bound by host time, which moves with where the scheduler puts the ranks). The rows are
    # merged into $OUT/distributed, with the median over repetitions.
    runs=()
    numa=()
    usage=$("$PY" -m torch.distributed.run --help 2>/dev/null || true)
    [[ "$usage" == *--numa-binding* ]] && numa=(--numa-binding node)
    read -ra order <<<"${COMPILERS:-eager torch_compile kiln}"
    for ((rep = 1; rep <= ${REPEAT:-1}; rep++)); do
        for setup in ${SETUPS:-ddp fsdp2}; do
            for compiler in "${order[@]}"; do
                dir="$OUT/distributed/$setup-$compiler-$rep"
                "$PY" -m torch.distributed.run --standalone --nproc_per_node "${NPROC:-2}" \
                    "${numa[@]}" benchmarks/distributed.py --device cuda --setups "$setup" \
                    --compilers "$compiler" --out "$dir" "$@" || echo "$setup/$compiler failed"
                runs+=("$dir")
            done
        done
        for ((i = 0, j = ${#order[@]} - 1; i < j; i++, j--)); do
            t=${order[i]} order[i]=${order[j]} order[j]=$t
        done
    done
    exec "$PY" benchmarks/distributed.py --merge "${runs[@]}" --out "$OUT/distributed"
elif [[ "$WHAT" == micro ]]; then
    exec "$PY" benchmarks/gpu_micro.py "$@"
elif [[ "$WHAT" == warm ]]; then  # cold and warm first calls, Kiln beside torch.compile
    exec "$PY" -m benchmarks.warm_start --device cuda --jobs "${JOBS:-4}" \
        --budget "${BUDGET:-420}" --out "$OUT/warm-start" "$@"
elif [[ "$WHAT" == gpus ]]; then
    first="${1%/*}" total="${1#*/}"
    shift
    read -ra list <<<"${GPU_LIST:-$(seq -s ' ' 0 $(($(nvidia-smi -L | wc -l) - 1)))}"
    gpus=${#list[@]}
    start=$SECONDS
    mkdir -p "$OUT"
    for ((i = 0; i < gpus; i++)); do
        g=${list[i]}
        (
            for ((s = first + i; s <= total; s += gpus)); do
                left=$(( ${BUDGET:-530} - (SECONDS - start) ))
                (( left > 120 )) || break
                mkdir -p "${TMPDIR:-/tmp}/gpu$g"
                CUDA_VISIBLE_DEVICES=$g TMPDIR="${TMPDIR:-/tmp}/gpu$g" BUDGET=$left \
                    bash "$ROOT/benchmarks/gpu_run.sh" "$s/$total" "$@" >"$OUT/gpu$g-shard$s.log" 2>&1 \
                    || echo "shard $s/$total failed (log: $OUT/gpu$g-shard$s.log)"
            done
        ) &
    done
    wait
    exit 0
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
