"""What an engine would run for the TP all-reduce at each measured token count, resolved inside the
engine's own venv (tests/checks/engine_exports.py runs these): the settings as the engine's own
parser reads the export (vLLM's EngineArgs and envs, SGLang's ServerArgs), the thresholds from
the engine's own modules, in the order its code tries them (vllm_facts/sglang_facts cite the lines).
On this CPU machine the GPU is told to be SM90 (vLLM's platform answers as the rows' GPU did), and
one table vLLM cannot import without its CUDA ops (FlashInfer's fusion bounds) is read from its
source file instead. The host is taken to have NVLink multicast (NVSwitch), as the rows' did.

Each script defines `check(job)` (job: argv, env, hidden, elem, tp, counts) returning {"version",
"kernels": {count: name}}, the names the export model's (stand_ins.Path.text without its size),
which engine_exports.py compares; engine_parsers.RUN runs every job of a venv in one process.
"""

VLLM = r'''
import ast, inspect, json, os, sys, types
import torch
import vllm
import vllm.envs as envs
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
current_platform.is_cuda = lambda: True  # the rows' GPU: SM90
current_platform.get_device_capability = lambda device_id=0: DeviceCapability(9, 0)
current_platform.is_device_capability = lambda c, device_id=0: c in (90, (9, 0))
current_platform.is_device_capability_family = lambda c, device_id=0: c // 10 == 9
import vllm.utils.flashinfer
vllm.utils.flashinfer.has_flashinfer = lambda: True  # a dependency of the wheel
from vllm.config.compilation import PassConfig
from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG
from vllm.distributed.device_communicators import all_reduce_utils as utils
from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce
from vllm.distributed.device_communicators.symm_mem import SymmMemCommunicator
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

# FI_ALLREDUCE_FUSION_MAX_SIZE_MB: its module needs vLLM's CUDA ops to import; read from its source
path = os.path.join(os.path.dirname(vllm.__file__), "compilation/passes/fusion/allreduce_rms_fusion.py")
tree = ast.parse(open(path).read())
name = "FI_ALLREDUCE_FUSION_MAX_SIZE_MB"
node = next(n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == name)
fusion_table = ast.literal_eval(node.value)[90]
PassConfig.default_fi_allreduce_fusion_max_size_mb = staticmethod(lambda: fusion_table)

ca_default = inspect.signature(CustomAllreduce.__init__).parameters["max_size"].default


def check(job):
    saved = dict(os.environ)
    os.environ.update(job["env"])  # vllm.envs reads the environment when asked
    try:
        engine = EngineArgs.from_cli_args(EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(job["argv"]))
        return {"version": vllm.__version__, "kernels": {t: kernel(engine, job, t) for t in job["counts"]}}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def kernel(engine, job, tokens):
    tp, row = engine.tensor_parallel_size, job["hidden"] * job["elem"]
    passes = engine.compilation_config.pass_config
    fusion = passes.fuse_allreduce_rms
    if fusion is None:  # vLLM's default at its optimization level
        rule = OPTIMIZATION_LEVEL_TO_CONFIG[engine.optimization_level]["compilation_config"]["pass_config"]["fuse_allreduce_rms"]
        cfg = types.SimpleNamespace(parallel_config=types.SimpleNamespace(tensor_parallel_size=tp))
        fusion = rule(cfg) if callable(rule) else rule
    bound = passes.flashinfer_max_size(tp) // row if fusion else None  # AllReduceFusionPass.max_token_num
    fi_max = int(fusion_table[tp] * 1024 * 1024)  # FlashInferAllReduce: the built-in table, not the user's bound
    symm_max = utils.SYMM_MEM_ALL_REDUCE_MAX_SIZES["9.0"].get(tp)
    symm_up = envs.VLLM_ALLREDUCE_USE_SYMM_MEM and symm_max is not None
    ca_max = min(utils.CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"][tp], ca_default) if symm_up else ca_default
    size = tokens * row
    if bound is not None and tokens <= bound:
        return "FlashInfer all-reduce + RMSNorm fusion"
    flashinfer = envs.VLLM_ALLREDUCE_USE_FLASHINFER and not fusion and size <= fi_max  # one workspace with the fusion
    message = torch.empty(size // 2, dtype=torch.bfloat16, device="meta")
    if not flashinfer and utils.should_nccl_symm_mem_allreduce(tp, message):
        return "NCCL symmetric kernels"
    if flashinfer:
        return "FlashInfer all-reduce, unfused"
    if not engine.disable_custom_all_reduce and tp in CustomAllreduce._SUPPORTED_WORLD_SIZES and size < ca_max:
        return "vLLM custom all-reduce"
    if symm_up and size <= symm_max:
        multimem = tp in SymmMemCommunicator._WORLD_SIZES_MULTIMEM["9.0"]
        return "PyTorch symmetric-memory all-reduce, " + ("multimem" if multimem else "two-shot")
    return "pynccl all-reduce"
'''

SGLANG = r'''
import argparse, json, os, sys
import sglang
from sglang.srt.distributed.device_communicators.all_reduce_utils import TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES
from sglang.srt.distributed.device_communicators.configs.custom_all_reduce_v2 import _sm90_configs
from sglang.srt.distributed.device_communicators.torch_symm_mem import TorchSymmMemCommunicator
from sglang.srt.environ import envs
from sglang.srt.layers.layer_boundary.residual.add_norm import FUSE_ALLREDUCE_MAX_BATCH_SIZE
from sglang.srt.server_args import ServerArgs


def check(job):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(job["argv"]))
    return {"version": sglang.__version__, "kernels": {t: kernel(args, job, t) for t in job["counts"]}}


def kernel(args, job, tokens):
    tp, row = args.tp_size, job["hidden"] * job["elem"]
    v2 = envs.SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2.get()
    ca_max = min(envs.SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB.get() * 1024, _sm90_configs(132)[tp].eager.two_shot_pull_threshold)
    symm_max = TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[9].get(tp)
    size = tokens * row
    if args.flashinfer_allreduce_fusion_backend is not None and tokens <= FUSE_ALLREDUCE_MAX_BATCH_SIZE:
        return "FlashInfer all-reduce + RMSNorm fusion"
    custom = not args.disable_custom_all_reduce and v2 and size <= ca_max
    if args.enable_symm_mem and not custom:
        return "NCCL symmetric kernels"
    if custom:
        return "custom all-reduce"
    if args.enable_torch_symm_mem and symm_max is not None and size < symm_max:
        multimem = tp in TorchSymmMemCommunicator._WORLD_SIZES_MULTIMEM[9]
        return "PyTorch symmetric-memory all-reduce, " + ("multimem" if multimem else "two-shot")
    return "NCCL all-reduce"
'''
