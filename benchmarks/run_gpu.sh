#!/usr/bin/env bash
# One batch of GPU measurements: the per-family benchmarks (issue figures), dlprim-bench's suites
# and the test suite on the GPU, each checked against a reference before it is timed, PyTorch
# timed in the same run.
#   bash benchmarks/run_gpu.sh OUTPUT_DIR [COMMIT] [STEP ...]
# STEP: conv, fusion, ops, gemm, bench, indexing (benchmarks/indexing.py), tests,
# tests-fusion-gemm, gemm-probe (GEMM variants at 4096^3 and 8192^3; winners over 1% become
# rules in DLPRIM_CACHE_DIR's database, which the gemm step then reads), and for the 1x1 and GEMM
# work gemm1x1-probe (the device's OpenCL extensions; folded against per-image and implicit
# GEMM on every 1x1 layer), tune-gemm (dlprim-tune on the GEMM shapes that were under 0.8x of
# the vendor library, merged into this device's rules under DLPRIM_CACHE_DIR, which later
# steps read) and conv1x1 (benchmarks/conv.py on the 1x1 layers, all directions); onnx
# (benchmarks/onnx.py, each model in a process of its own, so that one model's context state
# does not enter another's figures), onnx-cold (ResNet-50's load + plan in fresh processes,
# with empty kernel caches and with the cache that left), nets-b1 (the dp.functional networks at
# batch 1, the host-bound case) and gemm-tf32 (benchmarks/gemm_tf32.py: the TF32 GEMM against
# cuBLAS TF32), tf32-tests (tests/test_gemm_tf32.py and tests/test_conv_tf32.py on the tensor
# cores), conv-tf32 (benchmarks/conv.py --tf32 on ResNet-50's layers, cuDNN TF32 beside) and
# onnx-tf32 (ResNet-50 at batch 64 with TF32 on both sides), gemm-tf32-wide (the squares, then
# the mma kernel's large-tile variants, benchmarks/gemm_tf32.py's "wide" set), half-tests
# (the 16-bit GEMM, convolution and operator tests on the GPU), conv-fp16 / conv-bf16
# (benchmarks/conv.py --dtype on ResNet-50's layers, cuDNN's 16-bit convolutions beside),
# ops-half (the 16-bit operators against torch on the same dtype), attention-tests (the mma
# attention's PTX kernels), attention (benchmarks/attention.py: SDPA and the transformer block,
# with the block's device time per kernel), attention-tiles (the mma attention's tile
# settings), cumsum-probe (look-back tile lengths) and gemm-transformer (GEMM variants on a
# transformer block's shapes) (default: conv fusion ops bench). COMMIT is recorded in the JSON files (the copy on a lent
# machine may have no git metadata).
# Each step is bounded so that the whole run fits one call of the lent GPU machine. ARCHIVE=FILE
# packs the output folder into FILE after every step.
set -u
out=${1:?output folder}
commit=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
shift $(( $# >= 2 ? 2 : $# ))
steps=${*:-conv fusion ops bench}
mkdir -p "$out"
export DLPRIM_CACHE_DIR=${DLPRIM_CACHE_DIR:-/tmp/dlprim-cache} PYTHONUNBUFFERED=1 \
    DLPRIM_COMMIT=$commit
echo "commit $commit; steps: $steps"
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "exit $? after $((SECONDS - t0))s"
    grep -v $'\r' "$out/$name.log" | tail -n 25   # without progress-bar lines
    # The lent machine returns at most 8 files: with ARCHIVE set, the whole folder so far is
    # packed into that one file after every step (a later step cut short loses nothing).
    [ -n "${ARCHIVE:-}" ] && tar czf "$ARCHIVE" -C "$out" .
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
    tests) # one process per 2 cores when pytest-xdist is there (carry its wheel in .gpu/wheels)
           par=$(python3 -c "import xdist; import os; print('-n', max(1, os.cpu_count() // 2))" \
                 2>/dev/null)
           step tests 200 python3 -m pytest tests -q $par -p no:cacheprovider ;;
    tests-fusion-gemm) step tests-fusion-gemm 60 python3 -m pytest -q -x -p no:cacheprovider \
              tests/test_fusion.py tests/test_conv_gemm1x1.py tests/test_gemm.py ;;
    gemm1x1-probe) step gemm1x1-probe 45 python3 benchmarks/gemm1x1_probe.py --time-limit 30 \
              --output "$out" ;;
    tune-gemm) step tune-gemm 55 python3 -m dlprim_py.tune gemm --budget 28 --merge \
              --sizes 512x1568x4608,512x1568x2048,32x1000x2048,2048x1568x512,512x3136x2048 \
              --report "$out/tune-report.json"
              cp "$DLPRIM_CACHE_DIR/tuning/gemm.json" "$out/gemm-tuned.json" || echo "no tuning database written" ;;
    gemm-probe) step gemm-probe 100 python3 benchmarks/gemm_probe.py --squares 4096,8192 \
              --time-limit 60 --output "$out" --commit "$commit" \
              --write-rules "$DLPRIM_CACHE_DIR/tuning/gemm.json"
              cp "$DLPRIM_CACHE_DIR/tuning/gemm.json" "$out/gemm-probed.json" || echo "no rules written" ;;
    conv1x1) step conv1x1 65 python3 benchmarks/conv.py --directions forward backward_data \
              backward_filter --only 1x1 down project expand head --time-limit 48 \
              --commit "$commit" --output "$out/conv-h200-1x1.json" ;;
    indexing) step indexing 120 python3 benchmarks/indexing.py --commit "$commit" \
              --json "$out/indexing-h200.json" ;;
    onnx) for m in resnet50 mobilenet_v2 resnet18 vgg16 densenet121 efficientnet_b0; do
              step "onnx-$m" 60 python3 benchmarks/onnx.py --models "$m" --commit "$commit" \
                  --json "$out/onnx-$m.json"
          done ;;
    onnx-cold) step onnx-cold 60 python3 benchmarks/onnx.py --models resnet50 \
              --batch 1 --first-call --commit "$commit" --json "$out/onnx-cold.json" ;;
    nets-b1) step nets-b1 90 python3 benchmarks/nets.py --modes infer --infer-batches 1 \
              --commit "$commit" --json "$out/nets-b1.json" ;;
    gemm-tf32) step gemm-tf32 90 python3 benchmarks/gemm_tf32.py --json "$out/gemm-tf32.json" ;;
    gemm-tf32-wide) step gemm-tf32-wide 150 python3 benchmarks/gemm_tf32.py --only square \
              --variants --variant-set wide --json "$out/gemm-tf32-wide.json" ;;
    tf32-tests) step tf32-tests 240 python3 -m pytest tests/test_gemm_tf32.py \
              tests/test_conv_tf32.py -q -p no:cacheprovider ;;
    conv-tf32) step conv-tf32 150 python3 benchmarks/conv.py --tf32 --models resnet50 \
              --time-limit 120 --commit "$commit" --output "$out/conv-h200-tf32.json" ;;
    onnx-tf32) step onnx-tf32 90 python3 benchmarks/onnx.py --models resnet50 --batch 64 \
              --tf32 --commit "$commit" --json "$out/onnx-resnet50-tf32.json" ;;
    half-tests) step half-tests 360 python3 -m pytest tests/test_gemm_half.py \
              tests/test_conv_half.py tests/test_half_ops.py -q -p no:cacheprovider ;;
    ops-half) step ops-half 120 python3 benchmarks/ops.py --suites half --commit "$commit" \
              --output "$out/ops-half.json" ;;
    attention-tests) step attention-tests 150 python3 -m pytest tests/test_attention_mma.py \
              tests/test_attention.py tests/test_attention_tiled.py -q -p no:cacheprovider ;;
    attention) step attention 120 python3 benchmarks/attention.py --profile \
              --commit "$commit" --json "$out/attention.json" ;;
    attention-tiles) step attention-tiles 150 env PROBE_SET=mma PROBE_SEQS=512,2048 \
              OUT="$out" python3 benchmarks/attention_tiles.py ;;
    cumsum-probe) step cumsum-probe 90 python3 benchmarks/cumsum_probe.py ;;
    gemm-transformer) step gemm-transformer 150 python3 benchmarks/gemm_probe.py --squares "" \
              --shapes 4096x768x768,4096x3072x768,4096x768x3072,768x768x4096,768x3072x4096,3072x768x4096 \
              --only 768 --rounds 2 --time-limit 120 --commit "$commit" --output "$out" ;;
    conv-fp16) step conv-fp16 150 python3 benchmarks/conv.py --dtype float16 --models resnet50 \
              --time-limit 120 --commit "$commit" --output "$out/conv-h200-fp16.json" ;;
    conv-bf16) step conv-bf16 150 python3 benchmarks/conv.py --dtype bfloat16 --models resnet50 \
              --time-limit 120 --commit "$commit" --output "$out/conv-h200-bf16.json" ;;
    *) echo "unknown step $s"; exit 2 ;;
    esac
done
