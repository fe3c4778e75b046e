"""Launching a run on this machine: the re-launch under torchrun and the process tree that ends
with it, each worker's runtime session, the launch log, the hang guard, the machine's facts, and
what other processes hold on its GPUs."""
