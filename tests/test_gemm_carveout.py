"""The `gemm_carveout` knob of token_split and iso: the GEMMs of a split forward leave SMs free
for the communication lane's kernels (torch's SM carveout, cuBLAS's SM count target).

On CPU the carveout changes no kernel; what is checked is that the setting is in force exactly
while the forward's blocks compute, is restored after (also when the forward raises), leaves the
output what it is without it, and that the knob is sparse (earlier rows keep their keys)."""

from __future__ import annotations

import pytest
import torch

from overlapbench import strategies
from overlapbench.errors import UserError
from overlapbench.model.chunks import rope_positions
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS
from overlapbench.overlap.split import gemm_sm_carveout
from tests import distributed

SHAPE = PRESETS["tiny"]
LAYERS = 2


def test_the_carveout_is_set_inside_and_restored_after_even_on_an_error():
    before = torch._C._get_sm_carveout_experimental()
    with gemm_sm_carveout(12):
        assert torch._C._get_sm_carveout_experimental() == 12
        with gemm_sm_carveout(0):  # 0 leaves the setting alone
            assert torch._C._get_sm_carveout_experimental() == 12
    assert torch._C._get_sm_carveout_experimental() == before
    with pytest.raises(RuntimeError, match="inside"):
        with gemm_sm_carveout(5):
            raise RuntimeError("inside")
    assert torch._C._get_sm_carveout_experimental() == before


@pytest.mark.parametrize("name", ["token_split", "iso"])
def test_the_knob_is_sparse_and_bounded(name):
    cls = strategies.get(name)
    assert "gemm_carveout" not in cls.check_knobs({}, name)  # the points of earlier runs keep their keys
    assert "gemm_carveout" not in cls.check_knobs({"gemm_carveout": 0}, name)
    assert cls.check_knobs({"gemm_carveout": 16}, name)["gemm_carveout"] == 16
    for bad in (-1, 65, 2.5, "8"):
        with pytest.raises(UserError, match="gemm_carveout"):
            cls.check_knobs({"gemm_carveout": bad}, name)


def _rank_forward(rank, world, name, knobs, seq_lens):
    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.overlap import split
    from overlapbench.timing.step import BuildContext

    seen = []  # the carveout in force as each block computes
    compute = split.compute_block

    def watched(*args, **kwargs):
        seen.append(torch._C._get_sm_carveout_experimental())
        return compute(*args, **kwargs)

    split.compute_block = watched
    rt = runtime.init(timeout_s=60)
    stack = build_stack(SHAPE, LAYERS, world, rank, torch.float32, rt.device, 0)
    tokens = sum(seq_lens)
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(SHAPE, rope_positions(seq_lens, None), rt.device), tokens, None)
    cls = strategies.get(name)
    step = cls.build(ctx, cls.check_knobs(knobs, name))
    x = random_input(tokens, SHAPE.hidden, 0, torch.float32, rt.device)  # the reference's input
    out = step.to_full(step.forward(x)).clone()
    return out, seen, torch._C._get_sm_carveout_experimental()


@pytest.mark.slow
@pytest.mark.parametrize("name, knobs, seq_lens", [
    ("token_split", {"gemm_carveout": 8, "chunks": 3, "align": 1}, (37,)),
    ("iso", {"gemm_carveout": 20, "align": 1}, (29, 14)),
])
def test_a_carved_forward_computes_under_the_carveout_and_matches_the_reference(name, knobs, seq_lens):
    ref = reference_forward(SHAPE, LAYERS, 2, seq_lens, seed=0)
    for out, seen, after in distributed.run(_rank_forward, name, knobs, seq_lens, world=2):
        assert seen and set(seen) == {knobs["gemm_carveout"]}, seen  # every block, under the knob's value
        assert after is None  # and nothing after the forward
        err = distributed.rel_err(out, ref)
        assert err < 1e-5, f"{name} {knobs}: rel err {err:.2e}"
