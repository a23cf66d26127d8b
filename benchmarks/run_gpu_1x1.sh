#!/usr/bin/env bash
# One bounded batch of GPU measurements for the 1x1 convolutions and the GEMM engine:
#   bash benchmarks/run_gpu_1x1.sh OUTPUT_DIR COMMIT
# 1. gemm1x1_probe.py: the device's OpenCL extensions; folded GEMM against the per-image GEMM
#    and the implicit GEMM on every 1x1 layer, each checked against float64.
# 2. dlprim-tune on the GEMM shapes under 0.8x of the vendor library, merged into this
#    device's rules (the database under DLPRIM_CACHE_DIR, which the steps after it read).
# 3. benchmarks/gemm.py in full, 4. benchmarks/conv.py on the 1x1 layers, all directions.
# Each step is bounded so that the whole run fits one call of the lent GPU machine.
set -u
out=${1:?output folder}
commit=${2:?commit}
mkdir -p "$out"
export DLPRIM_CACHE_DIR=${DLPRIM_CACHE_DIR:-/tmp/dlprim-cache} DLPRIM_COMMIT=$commit
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "exit $? after $((SECONDS - t0))s"
    grep -v '\r' "$out/$name.log" | tail -n "${TAIL:-30}"
}
TAIL=12 step probe 45 python3 benchmarks/gemm1x1_probe.py --time-limit 30 --output "$out"
TAIL=8 step tune 55 python3 -m dlprim_py.tune gemm --budget 28 --merge \
    --sizes 512x1568x4608,512x1568x2048,32x1000x2048,2048x1568x512,512x3136x2048 \
    --report "$out/tune-report.json"
cp "$DLPRIM_CACHE_DIR/tuning/gemm.json" "$out/gemm-tuned.json" 2>/dev/null
TAIL=30 step gemm 45 python3 benchmarks/gemm.py --output "$out/gemm-h200.json"
TAIL=14 step conv 65 python3 benchmarks/conv.py --directions forward backward_data \
    backward_filter --only 1x1 down project expand head --time-limit 48 --commit "$commit" \
    --output "$out/conv-h200-1x1.json"
