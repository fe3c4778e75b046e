"""Engine exports: a tuned config as the files and flags an inference engine reads.

`picks` (what every engine's export shares: a tuned config's ranges, classified), one module per
engine (`tokenweave`, `vllm`, `sglang`, `trtllm`) with its facts in a table module beside it
(`*_facts`: key names, every default all-reduce path with its size limit, each fact with the file
and line of the engine's source, `facts.Fact`) and, for the judged engines, what its code runs at a
token count under a setting (`*_engine`); `choice` (the fastest setting an engine can express,
never slower than its defaults, judged from the rows through `stand_ins`), `notes` (the header
lines they share), `defaults` (`--defaults`: the default, the export and the tuned pick per batch)
and `command` (`overlapbench export`). Torch-free, like `tune` and `tuned`.
"""
