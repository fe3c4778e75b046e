"""Sweep specs: YAML -> validated sections, knobs and points (quick.yaml: the built-in demo)."""
