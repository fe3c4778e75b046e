import os

import pytest


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# Without GPUs, Triton kernels run in its interpreter; it must be set before triton is imported.
if _gpus() == 0:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if _gpus() >= 2:
        return
    skip = pytest.mark.skip(reason="needs 2 CUDA GPUs (runs on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
