"""The kernels' compiled code (sm_90, no GPU needed): every access to row data is one 16-byte
vector and nothing spills to local memory. Compiled in a subprocess: the CPU tests run Triton
in its interpreter, which cannot compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.distributed import REPO


@pytest.mark.slow
@pytest.mark.parametrize("hidden,world", [(8192, 2), (5120, 2), (4096, 4)])
def test_row_accesses_are_16_bytes_and_nothing_spills(hidden: int, world: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {
        "PYTHONPATH": str(REPO), "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "tests/checks/compiled_kernels.py", "--hidden", str(hidden), "--world", str(world),
                           "--json"], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    if done.returncode == 3:
        pytest.skip(done.stderr.strip()[-300:])
    assert done.returncode == 0, done.stderr[-3000:]
    for record in json.loads(done.stdout):
        narrow = {op: n for op, n in record["accesses"].items() if ".v4." not in op}
        # per-rank offsets and flag addresses (b64 scalars); flag waits (acquire b32)
        assert all(op == "ld.global.b64" or ".acquire." in op for op in narrow), (record["kernel"], narrow)
        assert "LOCAL:0 " in record["resources"] + " ", (record["kernel"], record["resources"])
