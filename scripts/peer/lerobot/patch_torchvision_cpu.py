"""Let the PyPI (CUDA-linked) torchvision 0.28.0 wheel import on CPU-only torch 2.13.0+cpu.

Its _C.so needs libtorch_cuda.so/libc10_cuda.so, which the CPU torch lacks, so the C ops
(nms, roi_align, ...) cannot load; torchvision/__init__.py then crashes while registering
fake/autograd kernels for those missing ops. We skip those two registrations when the ops
are absent. Pure-Python parts (transforms.v2, datasets, models) keep working; torchvision.ops
C kernels and torchvision's own video/image C decoders do not. Idempotent.
"""

import importlib.util
import pathlib
import sys

spec = importlib.util.find_spec("torchvision")
p = pathlib.Path(spec.origin)
src = p.read_text()
old = """from torchvision import (
    _autograd_registrations,
    _meta_registrations,
    datasets,"""
new = """if extension._has_ops():  # patched: CPU torch lacks the CUDA ops
    from torchvision import _autograd_registrations, _meta_registrations  # noqa: F401
from torchvision import (
    datasets,"""
if "patched: CPU torch lacks" in src:
    print("already patched", p)
    sys.exit(0)
assert old in src, "unexpected torchvision/__init__.py layout"
p.write_text(src.replace(old, new))
print("patched", p)
