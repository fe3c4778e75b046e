"""The engines' own parsers on an export, run inside each engine's venv by
tests/checks/engine_exports.py. Each script reads the jobs of one venv (JSON: name -> the folder, the
argv and env its script hands the engine, the config's TP, hidden size and dtype bytes, what the
export chose), imports the engine once, and prints one JSON line: name -> result with "ok".

- vLLM: `CompilationConfig(**json)` on compilation-config.json (pydantic, unknown keys refused, the
  values kept); the argv through `EngineArgs.add_cli_args` + `from_cli_args` gives the same pass
  config, TP and custom all-reduce switch; the env names are vLLM's; `PassConfig.flashinfer_max_size`
  // (hidden x dtype bytes) is the bound the export chose;
- SGLang: the argv through `ServerArgs.add_cli_args` (its argparse), each flag set;
- TensorRT-LLM: its `TorchLlmArgs` field for the strategy.
"""

VLLM = r'''
import json, sys
import vllm
import vllm.envs
from vllm.config import CompilationConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

def check(job):
  data = json.load(open(job["folder"] + "/compilation-config.json"))
  cc = CompilationConfig(**data)
  engine = EngineArgs.from_cli_args(EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(job["argv"]))
  same = engine.compilation_config.pass_config == cc.pass_config and engine.tensor_parallel_size == job["tp"]
  same = same and engine.disable_custom_all_reduce == ("--disable-custom-all-reduce" in job["argv"])
  env_known = all(name in vllm.envs.environment_variables for name in job["env"])
  bound = cc.pass_config.fi_allreduce_fusion_max_size_mb
  tokens = None if bound is None or not cc.pass_config.fuse_allreduce_rms else (
      cc.pass_config.flashinfer_max_size(job["tp"]) // (job["hidden"] * job["elem"]))
  try:
      CompilationConfig(pass_config={"not_a_pass_key": True})
      strict = False
  except Exception:
      strict = True
  kept = {k: getattr(cc.pass_config, k) for k in data["pass_config"]} == data["pass_config"]
  ok = same and kept and env_known and strict and tokens == job["fusion_tokens"]
  return {"version": vllm.__version__, "pass_config": data["pass_config"], "values_kept": kept,
          "cli_parses_to_same_config": same, "env": job["env"], "env_names_known": env_known,
          "unknown_key_refused": strict, "fusion_max_tokens": tokens, "chosen_fusion_tokens": job["fusion_tokens"],
          "ok": ok}
'''

SGLANG = r'''
import argparse, json, sys
import sglang
from sglang.srt.server_args import ServerArgs

def check(job):
  argv = job["argv"]
  parser = argparse.ArgumentParser()
  ServerArgs.add_cli_args(parser)
  args = ServerArgs.from_cli_args(parser.parse_args(argv))  # the dataclass, as launch_server builds it (no GPU work yet)
  switches = [a for a in argv if a.startswith("--enable") or a.startswith("--disable")]
  dests = {f: f[2:].replace("-", "_") for f in switches}
  option = "--flashinfer-allreduce-fusion-backend"
  fusion = argv[argv.index(option) + 1] if option in argv else None
  backend = args.flashinfer_allreduce_fusion_backend
  ok = args.tp_size == job["tp"] and all(getattr(args, d) is True for d in dests.values()) and backend == fusion
  return {"version": sglang.__version__, "tp_size": args.tp_size,
          "switches": {f: getattr(args, d) for f, d in dests.items()},
          "flashinfer_allreduce_fusion_backend": backend, "ok": ok}
'''

TRTLLM = r'''
import json, sys, yaml
import tensorrt_llm
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

def check(job):
  data = yaml.safe_load(open(job["folder"] + "/extra_llm_api_options.yaml"))
  field = TorchLlmArgs.model_fields["allreduce_strategy"]
  value = data["allreduce_strategy"]
  return {"version": tensorrt_llm.__version__, "value": value, "annotation": str(field.annotation),
          "default": field.default, "ok": value in str(field.annotation)}
'''

# Appended to each script: every job of the venv in one process, one failing job reported alone.
RUN = r'''
import json, sys, traceback
results = {}
for name, job in json.load(open(sys.argv[1])).items():
    try:
        results[name] = check(job)
    except (Exception, SystemExit) as e:  # argparse exits on a bad argv
        results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[-400:]}
print(json.dumps(results, default=str))
'''
