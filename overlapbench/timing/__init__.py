"""Timing: the Step contract, the one timing primitive (bench) and CUDA-graph capture, the sequential
mode, paired and interleaved rounds, the device's peak."""
