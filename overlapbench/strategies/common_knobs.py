"""Knobs several strategies share, defined once."""

from overlapbench.strategies.base import DEFAULT, Knob, Strategy

# The fused kernel's CTA budget limit; kernels.allreduce_norm checks the same number.
MAX_COMM_CTAS = 64

NCCL_MAX_CTAS = Knob(
    "nccl_max_ctas", int, DEFAULT,
    "SM budget of NCCL: max CTAs of its kernels (a process group created with that max_ctas)",
    bounds=(1, 64), library_default=True,
)
COMM = Knob(
    "comm", str, "nccl",
    "nccl: async NCCL all-reduce + fused add/RMSNorm; fused: one symmetric-memory all-reduce+norm "
    "kernel; none: no reduction (a bound, not a correct result: what the split alone costs)",
    choices=("nccl", "fused", "none"),
)
ALIGN = Knob("align", int, 256, "round the cut to a multiple of this many tokens", bounds=(1, 4096))


def comm_ctas(name: str, what: str) -> Knob:
    return Knob(name, int, 8, f"CTA budget of the fused all-reduce+norm kernel {what}", bounds=(1, MAX_COMM_CTAS))


class SplitStrategy(Strategy):
    """What token_split and iso share beyond the schedule: the comm knobs' rules."""

    cta_knobs: tuple[str, ...] = ()  # the CTA budgets that only comm=fused uses

    @classmethod
    def check_combination(cls, knobs, where):
        """Knobs that do not apply to the chosen `comm` are reset, so a grid over both comm
        paths does not measure the same setting twice."""
        if knobs["comm"] != "fused":
            for name in cls.cta_knobs:
                knobs[name] = None
        if knobs["comm"] != "nccl":
            knobs["nccl_max_ctas"] = DEFAULT

    @classmethod
    def is_checked(cls, knobs):
        return knobs["comm"] != "none"  # comm=none is a bound, not a correct result

    @classmethod
    def skip_reason(cls, knobs, cuda):
        if knobs["comm"] == "fused" and not cuda:
            return "comm=fused needs CUDA GPUs with symmetric memory"
        return None
