"""NCCL's tuning log read back: lines written here by hand in the formats NCCL 2.27 and 2.28
print (src/enqueue.cc, src/scheduler/symmetric_sched.cc), with and without a timestamp."""

from __future__ import annotations

import os

from overlapbench.distributed import nccl_log
from overlapbench.distributed.nccl_log import Launch

HEAD = "gpu-node-3:40211:40388 [0] NCCL INFO "
SYMMETRIC_228 = HEAD + "AllReduce [Symmetric]: 67108864 Bytes -> Kernel AllReduce_RSxLD_AGxST nchannels 8 nthreads 512 nWorks 1"
SYMMETRIC_227 = HEAD + "AllGather [Symmetric]: 33554432 Bytes -> Kernel AllGather_ST nchannels 16 nthreads 512"
CLASSIC = HEAD + "ReduceScatter: 33554432 Bytes -> Algo Ring proto Simple channel{Lo..Hi}={0..23}"
STAMPED = "[2026-11-24 10:02:03] " + HEAD + "AllReduce: 8 Bytes -> Algo Ring proto LL channel{Lo..Hi}={2..2}"


def test_symmetric_lines_give_the_kernel_and_its_channels():
    assert nccl_log.parse_line(SYMMETRIC_228) == Launch("AllReduce", 67108864, "AllReduce_RSxLD_AGxST", 8, True)
    assert nccl_log.parse_line(SYMMETRIC_227) == Launch("AllGather", 33554432, "AllGather_ST", 16, True)


def test_classic_lines_give_algo_proto_and_the_channel_range():
    assert nccl_log.parse_line(CLASSIC) == Launch("ReduceScatter", 33554432, "Ring/Simple", 24, False)
    assert nccl_log.parse_line(STAMPED) == Launch("AllReduce", 8, "Ring/LL", 1, False)


def test_other_lines_are_not_launches():
    for line in ["", "NCCL version 2.28.9+cuda13.0", HEAD + "Channel 00/24 : 0 1",
                 "\ngpu-node-3:1:2 [0] enqueue.cc:120 NCCL WARN AllReduce: invalid usage",
                 HEAD + "AllReduce [Symmetric]: 64 Bytes -> Kernel",  # cut short
                 HEAD + "NCCL_SYM_CTAS set by environment to 8"]:
        assert nccl_log.parse_line(line) is None, line
    assert nccl_log.parse("\n".join([CLASSIC, "junk", SYMMETRIC_228])) == [
        nccl_log.parse_line(CLASSIC), nccl_log.parse_line(SYMMETRIC_228)]


def test_a_case_matches_its_op_and_bytes_as_nccl_counts_them():
    ar = Launch("AllReduce", 1024, "AllReduce_RSxLD_AGxST", 4, True)
    ag = Launch("AllGather", 512, "AllGather_ST", 4, True)  # per rank: 1024 B gathered over 2 ranks
    small = Launch("AllReduce", 8, "Ring/LL", 1, False)  # the agreement around a measurement
    launches = [ar, ag, small]
    assert nccl_log.matching(launches, "all_reduce", 1024, 2) == [ar]
    assert nccl_log.matching(launches, "all_gather", 1024, 2) == [ag]
    assert nccl_log.matching(launches, "reduce_scatter", 1024, 2) == []
    assert nccl_log.matching(launches, "all_reduce", 16, 2) == []


def test_summary_is_the_most_frequent_kernel_and_names_the_others():
    sym = Launch("AllReduce", 1024, "AllReduce_RSxLD_AGxST", 8, True)
    ring = Launch("AllReduce", 1024, "Ring/Simple", 8, False)
    assert nccl_log.summarize([sym, sym, ring]) == {
        "nccl_kernel": "AllReduce_RSxLD_AGxST", "nccl_channels": 8, "nccl_symmetric": True, "nccl_also": ["Ring/Simple x8"]}
    assert nccl_log.summarize([ring]) == {"nccl_kernel": "Ring/Simple", "nccl_channels": 8, "nccl_symmetric": False}
    assert nccl_log.summarize([]) == {"nccl_kernel": None, "nccl_channels": None, "nccl_symmetric": None}


def test_the_log_is_read_from_a_mark(tmp_path):
    log = nccl_log.TuningLog(tmp_path / "nccl.log")
    assert log.mark() == 0 and log.since(0) == []  # NCCL has not written yet
    log.path.write_text(CLASSIC + "\n")
    mark = log.mark()
    with log.path.open("a") as f:
        f.write(SYMMETRIC_228 + "\n" + "junk\n")
    assert log.since(mark) == [nccl_log.parse_line(SYMMETRIC_228)]
    assert len(log.since(0)) == 2


def test_enable_turns_the_log_on_into_a_file_of_this_process(tmp_path):
    env: dict = {"NCCL_NVLS_ENABLE": "0"}
    log = nccl_log.enable(env, str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "TUNING"
    assert env["NCCL_DEBUG_FILE"] == str(log.path) and log.path.parent == tmp_path
    assert str(os.getpid()) in log.path.name and env["NCCL_NVLS_ENABLE"] == "0"


def test_enable_leaves_the_users_debug_settings_alone(tmp_path):
    for var in nccl_log.DEBUG_VARS:
        env = {var: "x"}
        assert nccl_log.enable(env, str(tmp_path)) is None
        assert env == {var: "x"}
