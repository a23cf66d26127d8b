#!/usr/bin/env bash
# One batch of GPU measurements: the per-family benchmarks (issue figures), dlprim-bench's suites
# and the test suite on the GPU, each checked against a reference before it is timed, PyTorch
# timed in the same run.
#   bash benchmarks/run_gpu.sh OUTPUT_DIR [COMMIT] [STEP ...]
# STEP: conv, fusion, ops, gemm, bench, tests, tests-fusion-gemm (default: conv fusion ops
# bench). COMMIT is
# recorded in the JSON files (the copy on a lent machine may have no git metadata).
# Each step is bounded so that the whole run fits one call of the lent GPU machine.
set -u
out=${1:?output folder}
commit=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
shift $(( $# >= 2 ? 2 : $# ))
steps=${*:-conv fusion ops bench}
mkdir -p "$out"
export DLPRIM_CACHE_DIR=${DLPRIM_CACHE_DIR:-/tmp/dlprim-cache} PYTHONUNBUFFERED=1
echo "commit $commit; steps: $steps"
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "exit $? after $((SECONDS - t0))s"
    tail -n 25 "$out/$name.log"
}
for s in $steps; do
    case $s in
    conv) step conv 230 python3 benchmarks/conv.py --find --commit "$commit" --time-limit 200 \
              --output "$out/conv-h200.json" ;;
    fusion) step fusion 60 python3 benchmarks/fusion.py --find --commit "$commit" \
              --json "$out/fusion-h200.json" ;;
    ops) step ops 120 python3 benchmarks/ops.py --commit "$commit" --output "$out/ops-h200.json" ;;
    gemm) step gemm 90 python3 benchmarks/gemm.py --commit "$commit" --output "$out/gemm-h200.json" ;;
    bench) step bench 240 python3 -m dlprim_py.bench --suite peak --suite gemm --suite ops \
              --suite fusion --suite conv --nets resnet50 --directions fwd --batch 64 \
              --time-limit 200 --no-progress --commit "$commit" --json "$out/bench-h200.json" ;;
    tests) step tests 200 python3 -m pytest tests -q -x -p no:cacheprovider ;;
    tests-fusion-gemm) step tests-fusion-gemm 60 python3 -m pytest -q -x -p no:cacheprovider \
              tests/test_fusion.py tests/test_conv_gemm1x1.py tests/test_gemm.py ;;
    *) echo "unknown step $s"; exit 2 ;;
    esac
done
