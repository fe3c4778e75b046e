"""Load each engine export through that engine's own parser (no GPU needed).

    python tests/checks/engine_exports.py [--venvs /tmp/ob-engines] [--out results/cpu-checks]

Exports the committed TP=2 tuned configs (results/h200x2/tuned/ and tuned/sp/, results/h100x2/331cb63/tuned/) for every engine,
then, per engine, in a scratch venv of its own under --venvs (created and `pip install`ed when
missing; an engine that does not install is reported with pip's last error lines):

- vLLM (0.33.0, and 0.31.0 for the sequence-parallel keys, each export made with that release's key
  names): `vllm.config.CompilationConfig(**json)` on compilation-config.json (pydantic, unknown keys
  refused, the values kept), the serve line through vLLM's own CLI parser (`EngineArgs.add_cli_args` +
  `from_cli_args`), and `PassConfig.flashinfer_max_size(tp)` // (hidden x dtype bytes) == the last
  fused_norm token count of the tuned config;
- SGLang: the launch line through `ServerArgs.add_cli_args` (its argparse), each flag set;
- TensorRT-LLM: its `TorchLlmArgs` when it installs; otherwise the YAML's value against the values
  read from its source (said so in the output);
- TokenWeave: its loader's logic (json.load, keys cast with int(), nearest key by absolute distance,
  first on a tie), run for every token count from the split switch to twice the largest range:
  the entry found must be the one for the tuned range holding that count.

Writes engine_exports.txt (what ran, what each parser said) and engine_exports.json under --out.
`--scan-wheels V...` instead prints the pass keys of each vLLM release V, read from its wheel.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from overlapbench import tuned  # noqa: E402
from overlapbench.export import tokenweave, tokenweave_facts  # noqa: E402
from overlapbench.export.command import EXPORTERS  # noqa: E402
from overlapbench.export.picks import leading_end, picks, write  # noqa: E402

PYTHON = "/root/.pyenv/versions/3.12.1/bin/python"
# A venv per (engine, release): (engine, the --engine-version its export is made for, the pip requirement).
# Two vLLM releases: the newest (no sequence-parallel keys) and the newest with them.
VENVS = {
    "vllm": ("vllm", "0.33.0", "vllm==0.33.0"),
    "vllm-0.31.0": ("vllm", "0.31.0", "vllm==0.31.0"),
    "sglang": ("sglang", None, "sglang==0.5.23"),
    "trtllm": ("trtllm", None, "tensorrt-llm==1.2.1"),
}
TUNED = (ROOT / "results/h200x2/tuned", ROOT / "results/h100x2/331cb63/tuned")  # H200 (with SP configs), the H100 re-run
BASE = {"nccl_max_ctas": "default"}


def inputs() -> dict[str, tuned.TunedConfig]:
    """The committed TP=2 tuned configs, and synthetic ones whose picks reach the switches the
    committed picks do not (symmetric-memory and NCCL-symmetric all-reduce, TokenWeave's split)."""
    found = [p for folder in TUNED for p in sorted(folder.glob("*.yaml")) + sorted(folder.glob("sp/*.yaml"))]
    out = {f"{p.parent.name}-{p.stem}": tuned.load(p) for p in found}
    like = next(iter(out.values()))
    for name, rules in SYNTHETIC.items():
        out[name] = tuned.TunedConfig(like.device, like.world_size, like.tp, like.model, like.shape, like.dtype,
                                      tuple(tuned.Rule(lo, hi, s, k) for lo, hi, s, k in rules))
    return out


SYNTHETIC = {
    "synthetic-symm-then-nccl": [(1, 2048, "baseline", BASE | {"allreduce": "one_shot"}), (2049, 32768, "baseline", BASE)],
    "synthetic-nccl-symm": [(1, 32768, "baseline", BASE | {"nccl_symm": True})],
    "synthetic-fused-split": [
        (1, 1500, "fused_norm", {"comm_ctas": 16}),
        (1501, 6000, "token_split", {"align": 256, "comm": "fused", "comm_ctas_attn": 8, "comm_ctas_mlp": 4, "split_offset": 0}),
        (6001, 32768, "token_split", {"align": 256, "comm": "fused", "comm_ctas_attn": 16, "comm_ctas_mlp": 8,
                                      "split_offset": 256}),
    ],
}

VLLM_CHECK = r'''
import json, shlex, sys
import vllm
import vllm.envs
from vllm.config import CompilationConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
folder, hidden, elem, tp, fused_end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
data = json.load(open(f"{folder}/compilation-config.json"))
cc = CompilationConfig(**data)
lines = open(f"{folder}/serve.sh").read().splitlines()
argv = shlex.split(next(l for l in lines if l.startswith("vllm serve")))[3:]  # after `vllm serve "$MODEL"`
engine = EngineArgs.from_cli_args(EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(argv))
same = engine.compilation_config.pass_config == cc.pass_config and engine.tensor_parallel_size == tp
same = same and engine.disable_custom_all_reduce == ("--disable-custom-all-reduce" in argv)
env = [l.split()[1].split("=")[0] for l in lines if l.startswith("export ")]
env_known = all(name in vllm.envs.environment_variables for name in env)
max_size = cc.pass_config.flashinfer_max_size(tp) if cc.pass_config.fuse_allreduce_rms else None
tokens = None if max_size is None else max_size // (hidden * elem)
try:
    CompilationConfig(pass_config={"not_a_pass_key": True})
    strict = False
except Exception:
    strict = True
kept = {k: getattr(cc.pass_config, k) for k in data["pass_config"]} == data["pass_config"]
ok = same and kept and env_known and strict and str(tokens) == fused_end
print(json.dumps({"version": vllm.__version__, "pass_config": {k: getattr(cc.pass_config, k) for k in data["pass_config"]},
                  "values_kept": kept,
                  "cli_parses_to_same_config": same, "env": env, "env_names_known": env_known,
                  "unknown_key_refused": strict, "fusion_max_tokens": tokens, "tuned_fused_end": fused_end, "ok": ok},
                 default=str))
'''

SGLANG_CHECK = r'''
import argparse, json, shlex, sys
import sglang
from sglang.srt.server_args import ServerArgs
folder = sys.argv[1]
line = [l for l in open(f"{folder}/launch.sh") if l.startswith("python -m sglang")][0]
argv = shlex.split(line)[3:]
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
ns = parser.parse_args(argv)
args = ServerArgs.from_cli_args(ns)  # the dataclass, as launch_server builds it (no GPU work yet)
switches = [a for a in argv if a.startswith("--enable") or a.startswith("--disable")]
dests = {f: f[2:].replace("-", "_") for f in switches}
option = "--flashinfer-allreduce-fusion-backend"
fusion = argv[argv.index(option) + 1] if option in argv else None
backend = args.flashinfer_allreduce_fusion_backend
ok = args.tp_size > 0 and all(getattr(args, d) is True for d in dests.values()) and backend == fusion
print(json.dumps({"version": sglang.__version__, "tp_size": args.tp_size,
                  "switches": {f: getattr(args, d) for f, d in dests.items()},
                  "flashinfer_allreduce_fusion_backend": backend, "ok": ok}))
'''

TRTLLM_CHECK = r'''
import json, sys, yaml
import tensorrt_llm
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs
data = yaml.safe_load(open(sys.argv[1] + "/extra_llm_api_options.yaml"))
field = TorchLlmArgs.model_fields["allreduce_strategy"]
print(json.dumps({"version": tensorrt_llm.__version__, "value": data["allreduce_strategy"], "annotation": str(field.annotation)}))
'''


def ensure_venv(name: str, venvs: Path, log: list[str]) -> Path | None:
    """The engine's venv python, installing it when missing; None (with pip's last lines logged) if it does not install."""
    venv = venvs / name
    python = venv / "bin/python"
    marker = venv / ".installed"
    if marker.exists():
        return python
    if not python.exists():
        subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True)
    package = VENVS[name][2]
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", package], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
        lines = [re.sub(r"/tmp/pip-build-env-\w+/", "PIP_BUILD_ENV/", ln) for ln in lines]
        telling = list(dict.fromkeys(ln.strip() for ln in lines if "Error" in ln or "wheel_stub" in ln))
        log.append(f"{name}: `pip install {package}` failed (exit {done.returncode}); the telling lines:")
        log += [f"    {ln}" for ln in (telling or lines)[-8:]]
        if any("wheel_stub" in ln for ln in lines):
            log.append(f"    ({package} on PyPI is a stub: at install it downloads the real wheel from its "
                       "vendor's own package index, which this machine cannot reach)")
        return None
    marker.write_text(package + "\n")
    return python


def installed(python: Path) -> str:
    """The versions that matter in a venv: the engine, torch, pydantic, FlashInfer."""
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
    wanted = ("vllm", "sglang", "tensorrt-llm", "torch", "pydantic", "flashinfer-python")
    found = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout or "[]")}
    return ", ".join(f"{n} {found[n]}" for n in wanted if n in found)


def run_in(python: Path, code: str, *args: str) -> dict:
    # VLLM_TARGET_DEVICE=cpu: vLLM's own switch for a machine without GPUs; without it its CLI
    # parser stops at "Failed to infer device type" before reading any option.
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([str(python), "-c", code, *args], capture_output=True, text=True, timeout=600, env=env)
    last = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not last:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return {"ok": False, "error": tail}
    return json.loads(last[-1])


def check_tokenweave(folder: Path, config: tuned.TunedConfig) -> dict:
    """TokenWeave's loader logic on the file: every count from the switch to twice the max finds
    the entry of its own tuned range."""
    family = tokenweave.family_of(config)
    path = folder / tokenweave.file_name(config)
    table = {int(k): v for k, v in json.loads(path.read_text()).items()}
    switch = tokenweave_facts.SPLIT_FROM[family]
    wrong = []
    for n in range(switch, 2 * config.max_tokens + 1):
        found = table[tokenweave_facts.nearest_key(table.keys(), n)]
        rule = config.choose(n).rule
        want, _ = tokenweave.entry_for(picks(config)[config.rules.index(rule)])
        if found != want:
            wrong.append(n)
    return {"keys": len(table), "counts_checked": 2 * config.max_tokens + 1 - switch, "wrong": wrong[:5], "ok": not wrong}


PASS_KEYS = ("enable_fi_allreduce_fusion", "fi_allreduce_fusion_max_token_num", "enable_sequence_parallelism",
             "enable_async_tp", "fuse_allreduce_rms", "fi_allreduce_fusion_max_size_mb", "enable_sp", "fuse_gemm_comms",
             "sp_min_token_num")


def scan_wheels(versions: list[str]) -> int:
    """Per vLLM release: the pass keys its PassConfig declares, read from its wheel (pip download,
    no install): the source of overlapbench/export/vllm_facts.py's VERSIONS."""
    for version in versions:
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                   "--python-version", "3.12", "-d", tmp, f"vllm=={version}"], capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if done.returncode or not wheels:
                print(f"{version}: no wheel ({(done.stderr.strip().splitlines() or ['?'])[-1]})")
                continue
            with zipfile.ZipFile(wheels[0]) as wheel:
                try:
                    source = wheel.read("vllm/config/compilation.py").decode()
                except KeyError:
                    print(f"{version}: no vllm/config/compilation.py")
                    continue
        tree = ast.parse(source)
        cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "PassConfig")
        fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        print(f"{version}: {', '.join(k for k in PASS_KEYS if k in fields)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venvs", type=Path, default=Path("/tmp/ob-engines"))
    parser.add_argument("--out", type=Path, default=ROOT / "results/cpu-checks")
    parser.add_argument("--scan-wheels", nargs="+", metavar="V", help="Instead: print each vLLM release's pass keys.")
    opts = parser.parse_args()
    if opts.scan_wheels:
        return scan_wheels(opts.scan_wheels)
    opts.venvs.mkdir(parents=True, exist_ok=True)
    exports = Path(tempfile.mkdtemp(prefix="ob-exports-"))
    configs = inputs()
    for venv, (engine, version, _) in VENVS.items():
        for name, cfg in configs.items():
            write(EXPORTERS[engine](cfg, name, version), exports / venv / name)
    for name, cfg in configs.items():
        write(EXPORTERS["tokenweave"](cfg, name, None), exports / "tokenweave" / name)
    log = [f"engine_exports.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; exports of "
           + ", ".join(configs)]
    results: dict = {}
    log.append("tokenweave: its loader's logic re-implemented from microsoft/tokenweave @ f483d1c "
               "(not installed: a vLLM fork built from source)")
    for name, cfg in configs.items():
        results[f"tokenweave/{name}"] = check_tokenweave(exports / "tokenweave" / name, cfg)
    checks = {"vllm": VLLM_CHECK, "sglang": SGLANG_CHECK, "trtllm": TRTLLM_CHECK}
    for venv, (engine, _, _) in VENVS.items():
        python = ensure_venv(venv, opts.venvs, log)
        if python is not None:
            log.append(f"{venv}: venv {opts.venvs / venv}, python 3.12, pip: {installed(python)}")
        for name, cfg in configs.items():
            folder = exports / venv / name
            key = f"{venv}/{name}"
            if python is None:
                results[key] = {"ok": None, "error": "not installed (see above)"}
                if engine == "trtllm":
                    results[key] |= _trtllm_from_source(folder)
                continue
            args = [str(folder)]
            if engine == "vllm":
                fused = leading_end(picks(cfg), ("fused_norm",))
                args += [str(cfg.shape["hidden"]), "2", str(cfg.tp), str(fused)]
            results[key] = run_in(python, checks[engine], *args)
    for key, value in results.items():
        log.append(f"{key}: {'ok' if value.get('ok') else 'NOT ok' if value.get('ok') is False else 'not checked'} "
                   f"{json.dumps({k: v for k, v in value.items() if k != 'ok'}, default=str)}")
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "engine_exports.txt").write_text("\n".join(log) + "\n")
    (opts.out / "engine_exports.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print("\n".join(log))
    return 0 if all(v.get("ok") is not False for v in results.values()) else 1


def _trtllm_from_source(folder: Path) -> dict:
    """Without the package: the YAML's value against the values read from its source (not its parser)."""
    from overlapbench.export import trtllm_facts

    text = (folder / "extra_llm_api_options.yaml").read_text()
    import yaml

    value = yaml.safe_load(text)[trtllm_facts.OPTION]
    return {"value": value, "source_values": list(trtllm_facts.STRATEGIES), "source_check": value in trtllm_facts.STRATEGIES}


if __name__ == "__main__":
    sys.exit(main())
