import os
import random

import pytest


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# Without GPUs, Triton kernels run in its interpreter; it must be set before triton is imported.
if _gpus() == 0:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need 2 CUDA GPUs, those also marked `one_gpu` one: skipped where fewer are here
    (cases at world size 4 also need 4: distributed.world_params skips them where fewer)."""
    gpus = _gpus()
    for item in items:
        if "gpu" not in item.keywords:
            continue
        needed = 1 if "one_gpu" in item.keywords else 2
        if gpus < needed:
            item.add_marker(pytest.mark.skip(reason=f"needs {needed} CUDA GPU{'s' * (needed > 1)} (runs on the GPU machine)"))


@pytest.fixture
def rng() -> random.Random:
    """A fresh random generator per test, its seed printed (a failing case can be replayed)."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    return random.Random(seed)
