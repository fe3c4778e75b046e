"""Timing a step: the Step contract, CUDA graphs and events, paired and interleaved rounds, the device's peak."""
