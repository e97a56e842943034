#!/usr/bin/env bash
# The prepared GPU check (<= 8 minutes): run it on a GPU machine from the repository root.
#   bash scripts/gpu_check.sh            # writes its logs and tables under ${OUT:-gpu-check}/
# 1. the engine's tests on CUDA where they have a CUDA path, and the data-parallel tests (gloo);
# 2. the step benchmark on one GPU (--quick: T=128), and the first step (independence check) vs
#    steady-step peaks (torch.cuda.max_memory_allocated, benchmarks/first_step.py --quick);
# 3. the data-parallel benchmark over NCCL on 2 GPUs where the machine has them (else 1 GPU).
# It uses the machine's python3 (its own CUDA build of torch); the repository goes on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
status=0
gpus=$($PY -c "import torch; print(torch.cuda.device_count())")
echo "GPUs: $gpus" | tee "$OUT/summary.txt"
timeout 180 $PY -m pytest -q -x tests/dprc_core/distributed/test_ddp.py tests/dprc_core/engine/test_step_semantics.py \
    2>&1 | tee "$OUT/tests.log" || status=1
timeout 150 $PY benchmarks/step.py --quick --device cuda 2>&1 | tee "$OUT/step.log" || status=1
timeout 120 $PY benchmarks/first_step.py --quick --device cuda 2>&1 | tee "$OUT/first_step.log" \
    || status=1
grep -E '^(PASS|FAIL):' "$OUT/first_step.log" | sed 's/^/first step: /' | tee -a "$OUT/summary.txt"
world=$(( gpus >= 2 ? 2 : 1 ))
timeout 120 $PY benchmarks/distributed.py --device cuda --world "$world" 2>&1 \
    | tee "$OUT/distributed.log" || status=1
cp docs/benchmarks/distributed_cuda.md "$OUT/" 2>/dev/null || true
echo "status: $status" | tee -a "$OUT/summary.txt"
exit $status
