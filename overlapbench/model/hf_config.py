"""A Hugging Face `config.json` -> the ModelShape of one of its decoder layers.

The shape is what transformers would build from the file (no network, no weights): a field the
file leaves out takes the default of transformers' config class for that `model_type` (say,
`num_key_value_heads` is 8 for mistral but `num_attention_heads` for llama; `head_dim` is 128
for qwen3), except the sizes that make the model, which must be present. What the layer does not
model (RoPE scaling, sliding windows, biases outside q/k/v) is said in `notes`, never an error:
none of it changes the layer's GEMMs or its communication, which is what is measured.

No torch here: specs are validated before any process starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overlapbench.errors import UserError, shown, unreadable
from overlapbench.model.models import ModelShape


@dataclass(frozen=True)
class Family:
    """How transformers reads one `model_type`: its defaults and attention details."""

    kv_heads: int | None  # num_key_value_heads when absent (None: num_attention_heads)
    head_dim: int | None  # head_dim when absent (None: hidden_size / num_attention_heads)
    eps: float  # rms_norm_eps when absent
    rope_theta: float  # rope_theta when absent
    qkv_bias: str  # "always" (qwen2), "flag" (attention_bias, also on o_proj), "never"
    qk_norm: bool = False  # Qwen3's per-head RMSNorm of q and k
    moe: str | None = None  # "mixtral" or "qwen3_moe": how the experts are named
    sliding: str = "use_sliding_window"  # "use_sliding_window": a switch; "always": on when set


FAMILIES = {
    "llama": Family(kv_heads=None, head_dim=None, eps=1e-6, rope_theta=1e4, qkv_bias="flag", sliding=""),
    "mistral": Family(kv_heads=8, head_dim=None, eps=1e-6, rope_theta=1e4, qkv_bias="never", sliding="always"),
    "qwen2": Family(kv_heads=32, head_dim=None, eps=1e-6, rope_theta=1e4, qkv_bias="always"),
    "qwen3": Family(kv_heads=32, head_dim=128, eps=1e-6, rope_theta=1e4, qkv_bias="flag", qk_norm=True),
    "mixtral": Family(kv_heads=8, head_dim=None, eps=1e-5, rope_theta=1e6, qkv_bias="never", moe="mixtral",
                      sliding="always"),
    "qwen3_moe": Family(kv_heads=4, head_dim=None, eps=1e-6, rope_theta=1e4, qkv_bias="flag", qk_norm=True,
                        moe="qwen3_moe"),
}
SUPPORTED = tuple(FAMILIES)


@dataclass(frozen=True)
class HFModel:
    """A config file read: the name rows carry, the shape, where each shape field came from
    (a JSON field, or the default taken), and what the layer does not model."""

    name: str
    shape: ModelShape
    sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def model_name(path: Path, data: dict) -> str:
    """What a row's `model` says: the file's stem, or for a file named config.json (a model
    downloaded from the Hub) its folder's name. `_name_or_path` is not used: saved configs
    often hold a local path of whoever saved them there."""
    if path.stem == "config" and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem


def is_config_path(model: str, base: Path | None = None) -> bool:
    """Whether a spec's `model` names a config file (ends in .json, or is an existing file)
    rather than a preset."""
    return model.endswith(".json") or resolve(model, base).is_file()


def resolve(model: str, base: Path | None) -> Path:
    """A relative path is relative to the spec file's folder (`base`), else to the cwd."""
    path = Path(model).expanduser()
    return path if path.is_absolute() or base is None else base / path


def read(path: str | Path) -> HFModel:
    """The file at `path`: a one-line UserError naming the file and the field for anything
    that is not a supported, well-formed config."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such config file; give a Hugging Face config.json "
                        f"(a relative path is relative to the spec's folder)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the config: {unreadable(e)}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON at line {e.lineno}; give a Hugging Face config.json") from None
    try:
        return from_config(data, model_name(path, data if isinstance(data, dict) else {}))
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


class _Reader:
    """Typed look-ups of a config's fields, remembering where each shape field came from."""

    def __init__(self, data: dict) -> None:
        self.data, self.sources = data, {}

    def present(self, key: str) -> bool:
        return self.data.get(key) is not None  # null: absent, as transformers reads it

    def int(self, key: str, default: int | None = None, why: str = "", minimum: int = 1) -> int:
        if not self.present(key):
            if default is None:
                raise UserError(f"{key}: missing; a config.json of this model_type has it")
            self.sources[key] = f"absent: {why or default}"
            return default
        value = self.data[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise UserError(f"{key}: must be an integer >= {minimum}, got {shown(value)}")
        self.sources[key] = key
        return value

    def number(self, key: str, default: float) -> float:
        if not self.present(key):
            self.sources[key] = f"absent: {default:g}"
            return default
        value = self.data[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise UserError(f"{key}: must be a positive number, got {shown(value)}")
        self.sources[key] = key
        return float(value)

    def flag(self, key: str) -> bool:
        value = self.data.get(key, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise UserError(f"{key}: must be true or false, got {shown(value)}")
        return value


def _rope(r: _Reader, family: Family, notes: list[str]) -> tuple[float, str]:
    """rope_theta (top level, or in transformers 5's rope_parameters), and a note for any RoPE
    scaling, which changes the cos/sin table's values, not the work, and is not modelled."""
    params = r.data.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise UserError(f"rope_parameters: must be a mapping, got {shown(params)}")
    scaling = r.data.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise UserError(f"rope_scaling: must be a mapping or null, got {shown(scaling)}")
    if r.present("rope_theta"):
        theta = r.number("rope_theta", family.rope_theta)
        where = "rope_theta"
    elif params and params.get("rope_theta") is not None:
        theta = _Reader(params).number("rope_theta", family.rope_theta)
        where = "rope_parameters.rope_theta"
    else:
        theta, where = family.rope_theta, f"absent: {family.rope_theta:g}"
    for name, section in (("rope_scaling", scaling), ("rope_parameters", params)):
        kind = (section or {}).get("rope_type") or (section or {}).get("type")
        if kind not in (None, "default"):
            factor = section.get("factor")
            notes.append(f"{name}: RoPE scaling {shown(kind)}{'' if factor is None else f' (factor {factor})'} is not "
                         f"modelled: RoPE uses plain rope_theta (the table's values differ, not the work)")
    return theta, where


def _moe(r: _Reader, family: Family) -> dict:
    """The expert fields of a MoE family; a stack mixing dense and MoE layers is refused."""
    if family.moe == "mixtral":
        return _experts(r, "num_local_experts", "intermediate_size")
    step = r.int("decoder_sparse_step", 1, minimum=0)
    dense_layers = r.data.get("mlp_only_layers") or []
    if not isinstance(dense_layers, list):
        raise UserError(f"mlp_only_layers: must be a list of layer indices, got {shown(dense_layers)}")
    if step != 1 or dense_layers:
        raise UserError("decoder_sparse_step / mlp_only_layers: this config mixes dense and MoE layers; "
                        "overlapbench measures a stack of identical layers (decoder_sparse_step 1, no mlp_only_layers)")
    return _experts(r, "num_experts", "moe_intermediate_size")


def _experts(r: _Reader, experts_key: str, width_key: str) -> dict:
    experts, top_k = r.int(experts_key), r.int("num_experts_per_tok")
    if top_k > experts:
        raise UserError(f"num_experts_per_tok: {top_k} exceeds {experts_key} {experts}")
    return {"experts": experts, "top_k": top_k, "expert_ffn": r.int(width_key)}


def from_config(data: Any, name: str) -> HFModel:
    """A parsed config.json -> its shape; errors name the JSON field."""
    if not isinstance(data, dict):
        raise UserError(f"not a JSON object of config fields (got {type(data).__name__}); give a Hugging Face config.json")
    kind = data.get("model_type")
    if kind not in FAMILIES:
        got = "missing" if kind is None else f"{shown(kind)} is not supported"
        raise UserError(f"model_type: {got}; supported: {', '.join(SUPPORTED)}")
    family, r, notes = FAMILIES[kind], _Reader(data), []
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
    default = "{} (transformers' default)".format
    kv_heads = r.int("num_key_value_heads", family.kv_heads or heads,
                     "num_attention_heads" if family.kv_heads is None else default(family.kv_heads))
    if family.head_dim is None and not r.present("head_dim") and hidden % heads:
        raise UserError(f"num_attention_heads: {heads} does not divide hidden_size {hidden}; give head_dim")
    head_dim = r.int("head_dim", family.head_dim or hidden // heads,
                     "hidden_size / num_attention_heads" if family.head_dim is None else default(family.head_dim))
    if heads % kv_heads:
        raise UserError(f"num_key_value_heads: {kv_heads} does not divide num_attention_heads {heads}")
    if head_dim % 2:
        raise UserError(f"head_dim: must be even for RoPE, got {head_dim}")
    eps = r.number("rms_norm_eps", family.eps)
    theta, theta_from = _rope(r, family, notes)
    bias = family.qkv_bias == "always" or (family.qkv_bias == "flag" and r.flag("attention_bias"))
    if family.qkv_bias == "flag" and bias:
        notes.append("attention_bias: the o_proj bias is not modelled (one add after the all-reduce); q/k/v biases are")
    if family.qkv_bias == "never" and r.flag("attention_bias"):
        notes.append(f"attention_bias: ignored, as transformers' {kind} ignores it (no attention biases)")
    if kind == "llama" and r.flag("mlp_bias"):
        notes.append("mlp_bias: MLP biases are not modelled")
    window = data.get("sliding_window")
    if window is not None and (family.sliding == "always" or (family.sliding and r.flag(family.sliding))):
        notes.append(f"sliding_window: {window} is not modelled: attention is full causal "
                     f"(the same for sequences up to {window} tokens)")
    act = data.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        notes.append(f"hidden_act: {shown(act)} is modelled as SiLU (the same GEMMs)")
    moe = _moe(r, family) if family.moe else {}
    ffn_key = "intermediate_size" if not family.moe or r.present("intermediate_size") else "moe_intermediate_size"
    ffn = r.int(ffn_key)
    shape = ModelShape(hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv_heads, head_dim=head_dim, eps=eps,
                       rope_theta=theta, qkv_bias=bias, qk_norm=family.qk_norm, **moe)
    sources = {
        "hidden": "hidden_size", "ffn": ffn_key, "heads": "num_attention_heads",
        "kv_heads": r.sources["num_key_value_heads"], "head_dim": r.sources["head_dim"],
        "eps": r.sources["rms_norm_eps"], "rope_theta": theta_from,
        "qkv_bias": {"always": f"{kind}: always", "never": f"{kind}: never"}.get(
            family.qkv_bias, "attention_bias" if "attention_bias" in data else "absent: false"),
        "qk_norm": f"{kind}: {'always' if family.qk_norm else 'never'}",
    }
    if family.moe == "mixtral":
        sources |= {"experts": "num_local_experts", "top_k": "num_experts_per_tok", "expert_ffn": "intermediate_size"}
    elif family.moe:
        sources |= {"experts": "num_experts", "top_k": "num_experts_per_tok", "expert_ffn": "moe_intermediate_size"}
    else:
        sources |= dict.fromkeys(("experts", "top_k", "expert_ffn"), f"{kind}: dense")
    return HFModel(name, shape, sources, tuple(notes))
