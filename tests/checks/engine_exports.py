"""Load each engine export through that engine's own parser, and resolve what the engine would run
at each measured token count through its own config code (no GPU needed).

    python tests/checks/engine_exports.py [--venvs /tmp/ob-engines] [--out results/cpu-checks]

Exports, for every engine, the committed TP=2 tuned configs (results/h200x2/tuned/ and tuned/sp/,
results/h100x2/331cb63/tuned/), the predicted TP=4 and TP=8 ones (results/predicted-h100/tuned/) and
synthetic ones whose rows make the export flip the switches the committed rows do not, each judged
from its rows. Each export's script is run by sh with a stand-in for the engine's program on PATH,
which records the argv and environment the script hands it. Then, per engine, in a scratch venv of
its own under --venvs (created and `pip install`ed when missing; an engine that does not install is
reported with pip's last error lines):

- the engine's own parser on the files and that argv (tests/checks/engine_parsers.py): vLLM 0.33.0
  and 0.31.0 (`CompilationConfig`, `EngineArgs`, its env names; the fusion bound read back through
  `PassConfig.flashinfer_max_size`), SGLang (`ServerArgs`), TensorRT-LLM (`TorchLlmArgs`, when it
  installs; otherwise the YAML's value against the values read from its source, said so);
- the semantics (tests/checks/engine_kernels.py): per measured token count, the all-reduce the engine
  would run, resolved from the settings as its parser read them and its own modules' thresholds,
  must be what the export's model of the engine says it runs; the tuned pick is logged beside it;
- TokenWeave: its loader's logic (json.load, keys cast with int(), nearest key by absolute distance,
  first on a tie), run for every token count from the split switch to twice the largest range: the
  entry found must be the one for the tuned range holding that count.

Writes engine_exports.txt (what ran, what each said) and engine_exports.json under --out (a CPU
check's output, not a GPU result). `--scan-wheels V...` instead prints the pass keys of each vLLM
release V, read from its wheel.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
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
from overlapbench.export import (  # noqa: E402
    engines,
    tokenweave,
    tokenweave_facts,
)
from overlapbench.export.command import Input, rows_of  # noqa: E402
from overlapbench.export.picks import picks, write  # noqa: E402
from tests.checks import engine_kernels, engine_parsers  # noqa: E402
from tests.export_rows import config, measured, rule  # noqa: E402

PYTHON = "/root/.pyenv/versions/3.12.1/bin/python"
# A venv per (engine, release): (engine, the --engine-version its export is made for, the pip requirement).
# Two vLLM releases: the newest (no sequence-parallel keys) and the newest with them.
VENVS = {
    "vllm": ("vllm", "0.33.0", "vllm==0.33.0"),
    "vllm-0.31.0": ("vllm", "0.31.0", "vllm==0.31.0"),
    "sglang": ("sglang", None, "sglang==0.5.23"),
    "trtllm": ("trtllm", None, "tensorrt-llm==1.2.1"),
}
TUNED = ("results/h200x2/tuned", "results/h100x2/331cb63/tuned")  # H200 (with SP configs), the H100 re-run
PREDICTED = "results/predicted-h100/tuned"  # TP=4 and TP=8, predicted from one H100's pieces
# The program each engine's script starts, and how many of its first arguments are not the engine's options.
PROGRAM = {"vllm": ("vllm", 2), "sglang": ("python", 2), "trtllm": ("trtllm-serve", 1)}
SCRIPT = {"vllm": "serve.sh", "sglang": "launch.sh", "trtllm": "serve.sh"}

# Synthetic configs and their rows (token count -> setting -> ms): each makes an export flip switches
# the committed rows leave alone. (name, tuned rules, hidden, tp, medians)
SYNTHETIC = {
    # NCCL beats every peer-memory path at 4 MiB: vLLM keeps its fusion below, turns off its custom
    # all-reduce and symmetric memory
    "synthetic-nccl-small": ([rule(1, 1024, "nccl")], 4096, 2,
                             {512: {"nccl": 0.8, "fused": 1.0, "one_shot": 1.1, "two_shot": 1.1},
                              1024: {"nccl": 1.6, "fused": 2.0, "one_shot": 2.2, "two_shot": 2.2}}),
    # the unfused one-shot beats the fusion: vLLM's fusion off, its standalone FlashInfer all-reduce on
    "synthetic-fusion-off": ([rule(1, 2048, "one_shot")], 4096, 2,
                             {1024: {"nccl": 1.2, "fused": 1.0, "one_shot": 0.8, "two_shot": 0.9},
                              2048: {"nccl": 2.4, "fused": 2.0, "one_shot": 1.6, "two_shot": 1.8}}),
    # the fusion wins past vLLM's built-in bound: it moves up; SGLang turns its fusion on
    "synthetic-fusion-wide": ([rule(1, 16384, "fused")], 4096, 2,
                              {1024: {"nccl": 1.0, "fused": 0.8, "one_shot": 0.95, "two_shot": 0.95},
                               16384: {"nccl": 16.0, "fused": 14.0, "one_shot": 16.5, "two_shot": 16.2}}),
    # PyTorch's two-shot beats NCCL at 32 MiB: SGLang's --enable-torch-symm-mem at TP 2
    "synthetic-torch-symm": ([rule(1, 2048, "two_shot")], 8192, 2,
                             {2048: {"nccl": 2.2, "fused": 2.1, "one_shot": 2.05, "two_shot": 1.9}}),
    # NCCL's symmetric kernels beat NCCL above everything else's sizes at TP 4
    "synthetic-tp4-nccl-symm": ([rule(1, 8192, "nccl_symm")], 8192, 4,
                                {4096: {"nccl": 4.0, "nccl_symm": 3.5, "fused": 4.2},
                                 8192: {"nccl": 8.0, "nccl_symm": 7.0, "fused": 8.4}}),
}


def inputs(scratch: Path) -> dict[str, tuple[tuned.TunedConfig, list]]:
    """The committed tuned configs with the rows behind them, and the synthetic ones with theirs."""
    found = [p for folder in TUNED for p in sorted((ROOT / folder).glob("*.yaml")) + sorted((ROOT / folder).glob("sp/*.yaml"))]
    found += sorted((ROOT / PREDICTED).glob("*.yaml"))
    out = {}
    with contextlib.chdir(ROOT):  # provenance names the rows relative to the repository root
        for path in found:
            relative = str(path.relative_to(ROOT))
            item = Input(tuned.load(path), relative, path.stem)
            out[f"{path.parent.name}-{path.stem}"] = (item.config, rows_of(item))
    for name, (rules, hidden, tp, medians) in SYNTHETIC.items():
        cfg = config(rules, model="llama3-70b" if hidden == 8192 else "llama3-8b", hidden=hidden, tp=tp)
        out[name] = (cfg, measured(scratch, medians, seed=len(name)))
    return out


def handed(folder: Path, engine: str, scratch: Path) -> dict:
    """The argv and environment the export's script hands the engine's program: the script run by
    sh, a stand-in for the program first on PATH."""
    program, skip = PROGRAM[engine]
    stub = scratch / "bin" / program
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"print(json.dumps({{'argv': sys.argv[1:], 'env': dict(os.environ)}}))\n")
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin", "MODEL": "model"}
    done = subprocess.run(["sh", str(folder / SCRIPT[engine])], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip()[-300:]}
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    names = re.findall(r"^export ([A-Za-z_][A-Za-z0-9_]*)=", (folder / SCRIPT[engine]).read_text(), re.M)
    argv = [a.replace(str(scratch), "$EXPORTS") for a in seen["argv"][skip:]]  # the log names no scratch folder
    return {"argv": argv, "env": {k: seen["env"][k] for k in names}}


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


def _size_free(text: str) -> str:
    return re.sub(r" \([0-9.]+ MiB\)$", "", text)


def run_jobs(python: Path, code: str, jobs: dict, scratch: Path) -> dict:
    """Every job of one venv through one script in one process (the engine imported once)."""
    path = scratch / f"jobs-{abs(hash(code))}.json"
    path.write_text(json.dumps(jobs))
    done = run_in(python, code + engine_parsers.RUN, str(path))
    return done if "ok" not in done else {name: done for name in jobs}  # the script itself failed: every job


def kernels_against_export(found: dict, export) -> dict:
    """The engine's kernels per measured count (its own code) against the export's model, the tuned pick beside."""
    if "kernels" not in found:
        return found
    ours = {line.tokens: _size_free(line.chosen.text) for line in export.choice.lines}
    theirs = {int(t): k for t, k in found["kernels"].items()}
    picks_at = {line.tokens: line.tuned_row.describe() if line.tuned_row else "?" for line in export.choice.lines}
    wrong = {t: {"engine": theirs[t], "export": ours[t]} for t in ours if theirs[t] != ours[t]}
    return {"version": found["version"], "per_count": {t: f"{theirs[t]} (tuned pick: {picks_at[t]})" for t in sorted(ours)},
            "wrong": wrong, "ok": not wrong}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venvs", type=Path, default=Path("/tmp/ob-engines"))
    parser.add_argument("--out", type=Path, default=ROOT / "results/cpu-checks")
    parser.add_argument("--scan-wheels", nargs="+", metavar="V", help="Instead: print each vLLM release's pass keys.")
    opts = parser.parse_args()
    if opts.scan_wheels:
        return scan_wheels(opts.scan_wheels)
    opts.venvs.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ob-exports-"))
    configs = inputs(scratch)
    exports = {}
    for venv, (engine, version, _) in VENVS.items():
        for name, (cfg, rows) in configs.items():
            exports[venv, name] = engines.get(engine).export(cfg, rows, name, version)
            write(exports[venv, name], scratch / venv / name)
    log = [f"engine_exports.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; exports of "
           + ", ".join(configs)]
    results: dict = {}
    log.append("tokenweave: its loader's logic re-implemented from microsoft/tokenweave @ f483d1c "
               "(not installed: a vLLM fork built from source)")
    for name, (cfg, _) in configs.items():
        try:
            write(engines.get("tokenweave").export(cfg, [], name, None), scratch / "tokenweave" / name)
            results[f"tokenweave/{name}"] = check_tokenweave(scratch / "tokenweave" / name, cfg)
        except Exception as e:  # a config TokenWeave cannot take: said so, not a failure of the check
            results[f"tokenweave/{name}"] = {"ok": None, "refused": str(e)}
    parsers = {"vllm": engine_parsers.VLLM, "sglang": engine_parsers.SGLANG, "trtllm": engine_parsers.TRTLLM}
    kernels = {"vllm": engine_kernels.VLLM, "sglang": engine_kernels.SGLANG}
    for venv, (engine, _, _) in VENVS.items():
        python = ensure_venv(venv, opts.venvs, log)
        if python is not None:
            log.append(f"{venv}: venv {opts.venvs / venv}, python 3.12, pip: {installed(python)}")
        jobs = {}
        for name, (cfg, _) in configs.items():
            folder, export, key = scratch / venv / name, exports[venv, name], f"{venv}/{name}"
            given = handed(folder, engine, scratch)
            if python is None:
                results[key] = {"ok": None, "error": "not installed (see above)", **given}
                if engine == "trtllm":
                    results[key] |= _trtllm_from_source(folder)
            elif "argv" not in given:
                results[key] = {"ok": False, **given}
            else:
                setting = export.choice.setting
                fusion_tokens = setting.fusion_tokens if engine == "vllm" and setting.fusion else None
                jobs[key] = {"folder": str(folder), **given, "tp": cfg.tp, "hidden": cfg.shape["hidden"], "elem": 2,
                             "counts": [line.tokens for line in export.choice.lines], "fusion_tokens": fusion_tokens}
        if not jobs:
            continue
        results |= run_jobs(python, parsers[engine], jobs, scratch)
        if engine in kernels:
            found = run_jobs(python, kernels[engine], jobs, scratch)
            for key in jobs:
                results[f"{key}/kernels"] = kernels_against_export(found[key], exports[venv, key.split("/", 1)[1]])
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
