"""The example section of docs/export.md, made from the committed tuned configs and their rows:

    python tests/checks/export_docs.py          # rewrite the section between its markers
    python tests/checks/export_docs.py --check  # exit 1 if the page is not what the files give

Each engine's export of the llama3-8b TP=2 config, then the engines' defaults, the export and the
tuned choice for llama3-70b and llama3-8b at TP=2 and TP=4, and for vLLM at TP=4 and TP=8
from predictions. tests/test_export.py fails
when the page and the committed files disagree (after the tuned YAMLs are regenerated: run this).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from overlapbench import tuned  # noqa: E402
from overlapbench.export import defaults, engines, sglang, tokenweave, trtllm, vllm  # noqa: E402
from overlapbench.export.command import Input, rows_of  # noqa: E402

PAGE = ROOT / "docs/export.md"
START, END = "<!-- export-example:start -->", "<!-- export-example:end -->"
TUNED = "results/h100x2/331cb63/tuned/{model}-tp2-nvidia-h100-80gb-hbm3-bf16.yaml"  # the TP=2 re-run on 2x H100
EXAMPLE = TUNED.format(model="llama3-8b")
PREDICTED = "results/predicted-h100/tuned/llama3-70b-tp{tp}-nvidia-h100-80gb-hbm3-predicted-bf16.yaml"
TP4 = "results/h200x4/c1821fe/tuned/{model}-tp4-nvidia-h200-bf16.yaml"  # the TP=4 runs on 4x H200
FENCE = {".json": "json", ".sh": "sh", ".yaml": "yaml", ".txt": "text"}


def section() -> str:
    """The generated markdown (from the repository root: the configs name their rows relative to it)."""
    with contextlib.chdir(ROOT):
        return _section()


def _section() -> str:
    config = tuned.load(ROOT / EXAMPLE)
    rows = rows_of(Input(config, EXAMPLE, Path(EXAMPLE).stem))
    exports = {
        "tokenweave": tokenweave.export(config, rows, EXAMPLE, None),
        "vllm": vllm.export(config, rows, EXAMPLE, None),
        "sglang": sglang.export(config, rows, EXAMPLE, None),
        "trtllm": trtllm.export(config, rows, EXAMPLE, None),
    }
    parts = [f"Made by `python tests/checks/export_docs.py` from `{EXAMPLE}`; each block is the file "
             f"`overlapbench export {EXAMPLE} --engine ENGINE` writes.\n"]
    for engine, export in exports.items():
        parts.append(f"\n#### {engine}\n")
        for name, text in export.files.items():
            parts.append(f"\n`{engine}/{Path(EXAMPLE).stem}/{name}`:\n\n```{FENCE[Path(name).suffix]}\n{text}```\n")
    parts.append("\n#### The engines' defaults, the export and the tuned choice\n\n"
                 "`overlapbench export TUNED.yaml --engine ENGINE --defaults`, for vLLM 0.33.0 and SGLang 0.5.23 at "
                 "TP=2 (the H100 re-run) and TP=4 (the 4x H200 runs), and vLLM at TP=4 and TP=8 from the predicted "
                 "H100 rows:\n")
    tables = [(engine, tuned_path.format(model=model)) for tuned_path in (TUNED, TP4) for engine in ("vllm", "sglang")
              for model in ("llama3-70b", "llama3-8b")]
    tables += [("vllm", PREDICTED.format(tp=tp)) for tp in (4, 8)]
    for engine, path in tables:
        item = Input(tuned.load(ROOT / path), path, Path(path).stem)
        parts.append("\n" + defaults.markdown(engines.get(engine), item.config, rows_of(item), path))
    return "".join(parts)


def render(page: str, generated: str) -> str:
    head, _, rest = page.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{generated}{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    opts = parser.parse_args()
    page = PAGE.read_text()
    new = render(page, section())
    if opts.check:
        return 0 if new == page else 1
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
