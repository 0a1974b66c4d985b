#!/usr/bin/env bash
# A user's install, for real: `pip install --no-build-isolation .` into a new virtual environment that holds torch
# and nothing else. Then, with install_requires alone: `import overinterp_fast`, fast_sis, `overinterp-fast --help`,
# and the audit command ending in one line that names the [audit] extra; then with '.[audit]': a real small audit
# (results.json, sis.parquet, report.html). It fails when setup.py's install_requires or the audit extra lacks a
# module the package needs.
#
# Cheap: the new environment gets this environment's torch through a .pth file naming a folder of symlinks to torch
# and the distributions it requires (scripts/torch_only.py), not a copy of its gigabytes; pip is this
# environment's (`pip --python`); the rest (numpy, tqdm, filelock; torchvision, pillow, matplotlib, pyarrow, scipy)
# is installed as pip finds it, with torch pinned to the installed one so that pip never replaces it. The compiled
# extension is not built here (OVERINTERP_FAST_BUILD_EXT=0: minutes on 2 cores; scripts/setup_env.sh builds it):
# the package runs on its pure-PyTorch ops. FRESH_BUILD_EXT=1 builds it as a user's install does.
#
#   scripts/check_fresh_install.sh        # PYTHON: an interpreter with torch (default: .venv/bin/python)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # absolute: the script changes folders
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log() { printf '[fresh install] %s\n' "$*" >&2; }
fail() { printf '[fresh install] FAILED: %s\n' "$*" >&2; exit 1; }
start=$SECONDS

log "a new virtual environment with torch alone ($work/venv)"
"$PY" "$ROOT/scripts/torch_only.py" "$work/torch-only"
"$PY" -m venv --without-pip "$work/venv"
VPY="$work/venv/bin/python"
site="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$work/torch-only" > "$site/_torch_only.pth"
"$VPY" -W ignore -c "import torch" || fail "torch does not import in the new environment"
if "$VPY" -c "import numpy" 2>/dev/null; then fail "the new environment has numpy before the install"; fi
echo "torch==$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')" > "$work/constraints.txt"

# the sources as a checkout has them (tracked and untracked files; ignored ones, such as builds, left out)
mkdir "$work/src"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$ROOT" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$work/src"
else  # not a git checkout: everything but environments and builds
  tar -C "$ROOT" --exclude=.venv --exclude=build --exclude='*.egg-info' --exclude='*.so' --exclude=.git -cf - . \
    | tar -xf - -C "$work/src"
fi

pipv() { PIP_CONSTRAINT="$work/constraints.txt" PYTHONWARNINGS=ignore "$PY" -m pip --python "$VPY" "$@" 2>&1 \
  | { grep -v -e "^WARNING: Location" -e "Failed to initialize NumPy" -e "_conversion_method_template" || true; }; }
export OVERINTERP_FAST_BUILD_EXT="${FRESH_BUILD_EXT:-0}"
[ "$OVERINTERP_FAST_BUILD_EXT" = 1 ] && export OVERINTERP_FAST_BUILD_EXT= FORCE_CUDA=0

log "pip install --no-build-isolation . (install_requires alone)"
pipv install -q --no-build-isolation "$work/src" || fail "pip install ."
pipv check >/dev/null || fail "pip check"
cd "$work"
"$VPY" - <<'PY' || fail "the core (import overinterp_fast, fast_sis) with install_requires alone"
import warnings
warnings.simplefilter("ignore")  # the compiled extension is not built here
import torch
import overinterp_fast as of
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                          torch.nn.Flatten(), torch.nn.Linear(4, 5)).eval()
res = of.fast_sis(net, torch.randn(2, 3, 8, 8), threshold=0.5)
assert len(res) == 2 and res[0].order.numel() == 64
torch.export.save(torch.export.export(net, (torch.zeros(2, 3, 8, 8),),
                                      dynamic_shapes=({0: torch.export.Dim("batch")},)), "net.pt2")
PY
PYTHONWARNINGS=ignore "$work/venv/bin/overinterp-fast" --help >/dev/null || fail "overinterp-fast --help"
audit=("$work/venv/bin/overinterp-fast" audit --model net.pt2 --images images --size 8 --method exact --workers 0
       --quiet --gallery 2 --out audit)
set +e
PYTHONWARNINGS=ignore "${audit[@]}" > out.txt 2> err.txt  # (the warning that the extension is not built)
code=$?
set -e
want="overinterp-fast: error: the audit needs matplotlib, pillow, pyarrow, scipy, torchvision, which are not installed: pip install 'overinterp-fast[audit]'"
if [ "$code" != 2 ] || [ "$(cat err.txt)" != "$want" ]; then
  cat err.txt >&2
  fail "without the audit extra, the audit command must end in one line naming it (exit $code)"
fi

log "pip install --no-build-isolation '.[audit]'"
pipv install -q --no-build-isolation "$work/src[audit]" || fail "pip install '.[audit]'"
pipv check >/dev/null || fail "pip check"
"$VPY" - <<'PY' || fail "writing the audit's images"
import os
import numpy as np
from PIL import Image
os.makedirs("images")
for i in range(3):
    Image.fromarray(np.random.default_rng(i).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(f"images/im{i}.png")
PY
"${audit[@]}" > out.txt 2> err.txt || { cat err.txt >&2; fail "a small audit with the audit extra"; }
"$VPY" - <<'PY' || fail "the audit's results"
import json
doc = json.load(open("audit/results.json"))
assert doc["status"] == "complete" and doc["n_images"] == 3, doc.get("status")
import pyarrow.parquet as pq
assert pq.read_table("audit/sis.parquet").num_rows == 3
assert "<html" in open("audit/report.html").read()
PY
log "passed in $((SECONDS - start)) s: install_requires gives the core and the one-line message; [audit] a real audit"
