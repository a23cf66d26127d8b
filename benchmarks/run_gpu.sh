#!/usr/bin/env bash
# One batch of GPU measurements: the operator benchmarks (issue figures) and dlprim-bench's
# suites, each checked against a reference before it is timed, PyTorch timed in the same run.
#   bash benchmarks/run_gpu.sh OUTPUT_DIR
# Each step is bounded so that the whole run fits one call of the lent GPU machine.
set -u
out=${1:?output folder}
mkdir -p "$out"
export DLPRIM_CACHE_DIR=${DLPRIM_CACHE_DIR:-/tmp/dlprim-cache}
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
echo "commit $commit"
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "exit $? after $((SECONDS - t0))s"
    tail -n 40 "$out/$name.log"
}
step ops 150 python3 benchmarks/ops.py --output "$out/ops-h200.json"
step fusion 150 python3 benchmarks/fusion.py --find --json "$out/fusion-h200.json"
step bench 240 python3 -m dlprim_py.bench --suite peak --suite gemm --suite ops --suite fusion \
    --suite conv --nets resnet50 --directions fwd --batch 64 --time-limit 200 --no-progress \
    --json "$out/bench-h200.json"
