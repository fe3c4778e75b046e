"""Engine exports: a tuned config as the files and flags an inference engine reads.

`picks` (what every engine's export shares: a tuned config's ranges, classified), one module per
engine (`tokenweave`, `vllm`, `sglang`, `trtllm`) with its facts in a table module beside it
(`*_facts`: key names, thresholds, defaults, each with the source and version it was read from),
`defaults` (what the engine's built-in defaults run, against the tuned choice, from the rows) and
`command` (`overlapbench export`). Torch-free, like `tune` and `tuned`.
"""
