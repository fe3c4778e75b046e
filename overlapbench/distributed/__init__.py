"""The distributed runtime, the ground every collective stands on: process groups (NCCL's CTA
budgets among them), devices, streams, symmetric memory, NCCL's registered windows and its tuning
log. It imports nothing of the package above it; what the layer needs from it, it is handed."""

DEFAULT = "default"  # a CTA budget (and any knob) left to the library: NCCL's own choice
