#!/usr/bin/env bash
# The prepared GPU check (<= 8 minutes by its own estimate): run it from the repository root.
#   bash scripts/gpu_check.sh             # on a GPU machine: results in ${OUT:-gpu-check}/
#   bash scripts/gpu_check.sh --dry-run   # on a CPU: the same code paths at toy sizes
#                                         # (the suite runs it: tests/test_gpu_check_dry_run.py)
# 0. the plan (benchmarks/gpu_step.py --plan): what runs, each section's estimate and the total,
#    printed before anything runs; cells over the budget are dropped there, and said so;
# 1. step: one training step of a ~0.85B Llama (bf16; full fine-tuning and LoRA; T = 2048, 8192;
#    B = 1, 4): non-private, dprc exact / hutch k=32 / auto, Opacus ghost; time, tokens/s, steady
#    and first-step peaks (torch.cuda.max_memory_allocated); an OOM is a result;
# 2. norm: the norm pass alone on the paper's 8192x2048 layer at T = 4096, hutch k=32 vs exact;
# 3. tests: the engine's tests on CUDA where they have a CUDA path, and the data-parallel tests;
# 4. distributed: the data-parallel benchmark over NCCL on 2 GPUs when the machine has them;
# 5. fsdp: FSDP2 against data-parallel on 2 GPUs (NCCL), each rank's max_memory_allocated
#    (benchmarks/fsdp.py --device cuda; at most 7 min beyond the plan, which counts 1-4);
#    skipped, and said so, on a machine with one GPU.
# 6. vllm: dprc's completions router against a real vLLM server (scripts/vllm_check.py): a base
#    model and a LoRA adapter registered at run time, streamed and not, 8 concurrent requests;
#    skipped, and said so, where vLLM is not installed.
# 7. synthetic: benchmarks/synthetic.py --device cuda --quick --hidden 768 --layers 12 (issue
#    44): the synthetic-data pipeline at about 64 M parameters (hidden 768, 12 layers, random
#    weights; non-private and DP ε = 8 fine-tuning on CUDA, then generation),
#    1 seed, 600 lines; its table goes to run.log and one summary line per row to summary.txt
#    (no file of its own); at most 3 min beyond the plan. The dry run: --device cpu --epochs 1.
# 8. ray: a job on 2 Ray nodes of this machine, a GPU each (NCCL), against one process (issue 46,
#    scripts/ray_gpu_check.py: steps and ε equal, max weight difference, wall times); skipped,
#    and said so, with one GPU or where Ray is not installed; at most 4 min beyond the plan.
# The dry run skips 3, 4, 5, 6 and 8 (CUDA only). Every section runs under its own `timeout`. $OUT gets
# few files (at most 8 come back from a lent device): summary.txt, run.log, gpu.md, gpu.json,
# tests.log, distributed_cuda.md, fsdp_cuda.md, fsdp_cuda.json. It uses $PY (default: the
# machine's python3, its own CUDA build of torch); the repository goes on PYTHONPATH.
set -uo pipefail
dry=0
case "${1:-}" in
    --dry-run) dry=1 ;;
    "") ;;
    *) echo "usage: bash scripts/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Packages the device's image lacks (dprc_core's dp-accounting and cryptography with cffi and
# pycparser; opacus for its cells) travel as wheels in .whl/ (docs/benchmarks/gpu.md).
site="${TMPDIR:-/tmp}/gpu-check-site"
if ((!dry)) && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl && export PYTHONPATH="$PYTHONPATH:$site"
fi
bench=("$PY" benchmarks/gpu_step.py --out "$OUT")
((dry)) && bench+=(--dry-run)
: >"$OUT/summary.txt"
: >"$OUT/run.log"
status=0
start=$SECONDS

# 0. The plan, before anything runs; its last line holds the GPU count and the timeouts.
if ! plan=$(timeout 60 "${bench[@]}" --plan 2>>"$OUT/run.log"); then
    echo "$plan"
    echo "the plan failed (see $OUT/run.log)" | tee -a "$OUT/summary.txt"
    exit 1
fi
echo "$plan" | tee -a "$OUT/summary.txt" "$OUT/run.log"
setting() { sed -n "s/^timeouts:.* $1=\([0-9]*\).*/\1/p" <<<"$plan"; }

# Runs one section under `timeout`, its output appended to a log; records its exit status.
section() {
    local name=$1 limit=$2 log=$3 begun=$SECONDS rc
    shift 3
    echo "== $name (timeout ${limit}s) ==" | tee -a "$log"
    timeout "$limit" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    [[ $rc -eq 124 ]] && echo "$name: killed by its timeout (${limit}s)" | tee -a "$log"
    echo "section $name: exit $rc, $((SECONDS - begun)) s" >>"$OUT/summary.txt"
    [[ $rc -eq 0 ]] || status=1
}

section step "$(setting step)" "$OUT/run.log" "${bench[@]}" --section step
section norm "$(setting norm)" "$OUT/run.log" "${bench[@]}" --section norm
if ((dry)); then
    echo "section tests, distributed, fsdp, vllm: skipped (dry run: CUDA and NCCL only)" \
        >>"$OUT/summary.txt"
else
    section tests "$(setting tests)" "$OUT/tests.log" "$PY" -m pytest -q -x -p no:cacheprovider \
        tests/dprc_core/distributed/test_ddp.py tests/dprc_core/engine/test_step_semantics.py
    gpus=$(setting gpus)
    world=$((gpus >= 2 ? 2 : 1))
    section distributed "$(setting distributed)" "$OUT/run.log" \
        "$PY" benchmarks/distributed.py --device cuda --world "$world"
    cp docs/benchmarks/distributed_cuda.md "$OUT/" 2>/dev/null || true
    if ((gpus >= 2)); then
        section fsdp 420 "$OUT/run.log" "$PY" benchmarks/fsdp.py --device cuda --out "$OUT"
    else
        echo "section fsdp: skipped (FSDP2 over NCCL needs 2 GPUs; this machine has $gpus)" \
            >>"$OUT/summary.txt"
    fi
    section vllm 300 "$OUT/run.log" "$PY" scripts/vllm_check.py --timeout 200
    if ((gpus < 2)); then
        echo "section ray: skipped (2 Ray nodes a GPU each need 2 GPUs; this machine has $gpus)" \
            >>"$OUT/summary.txt"
    elif ! "$PY" -c "import ray.train" 2>/dev/null; then
        echo "section ray: skipped (Ray is not installed: pip install 'dprc[ray]')" \
            >>"$OUT/summary.txt"
    else
        section ray 240 "$OUT/run.log" "$PY" scripts/ray_gpu_check.py --device cuda
    fi
fi
synthetic=("$PY" benchmarks/synthetic.py --quick --device cuda --hidden 768 --layers 12)
((dry)) && synthetic=("$PY" benchmarks/synthetic.py --quick --device cpu --epochs 1)
section synthetic 180 "$OUT/run.log" "${synthetic[@]}"
grep -h '^summary: ' "$OUT/run.log" | sed 's/^summary: //' >>"$OUT/summary.txt"
echo "wall: $((SECONDS - start)) s; status: $status" | tee -a "$OUT/summary.txt"
exit $status
