"""pytest-benchmark cases of the kernels and the exact loop's own cost, outside the test suite
(``pytest python_tests`` never collects this folder). Run and compare against the stored baseline:

    pytest benchmarks --benchmark-only --benchmark-storage=benchmarks/baseline --benchmark-compare \
        --benchmark-compare-fail=median:50%

See benchmarks/README.md.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/common.py
