"""Triton kernels on CPU machines, in Triton's interpreter: a test module of such kernels calls
`use_interpreter()` first, before anything imports triton."""

from __future__ import annotations

import os

import pytest


def use_interpreter():
    """The triton module, in interpreter mode; skips the module where it cannot run so (a GPU
    machine's session runs the GPU tests beside it, which the interpreter would break; no triton)."""
    torch = pytest.importorskip("torch")
    if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
        pytest.skip("interpreter tests run on CPU machines (tests/conftest.py sets TRITON_INTERPRET there)",
                    allow_module_level=True)
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton sees a kernel
    return pytest.importorskip("triton")
