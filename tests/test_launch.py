"""Running things: workers die with their launcher; a dying worker is one true
paragraph; a study too big for the machine is refused before it starts; a command that would do
nothing says so; one results file holds one study; nothing is left beside the results."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from overlapbench.errors import UserError
from overlapbench.launch import launch_log
from overlapbench.run import footprint
from overlapbench.specs import spec
from overlapbench.tuning.results import SCHEMA, ResultStore, kept, read_rows
from tests import synthetic
from tests.distributed import REPO, overlapbench


def write_spec(tmp_path: Path, name: str = "long", tokens=range(16, 40), **extra) -> Path:
    """A tiny-model sweep long enough (dozens of points) to be stopped in its middle."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "model": "tiny", "layers": 2, "tokens": list(tokens),
        "strategies": {"baseline": {}, "token_split": {"align": 8}},
        "measure": {"warmup": 1, "iters": 20, "timeout_s": 60}, **extra,
    }, sort_keys=False))
    return path


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    """`overlapbench ARGS` in the background, in a session of its own (as a scheduler starts it)."""
    env = os.environ | {"PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "overlapbench", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(stream, pattern: str) -> None:
    for line in stream:
        if re.search(pattern, line):
            return
    raise AssertionError(f"no line matching {pattern!r}")


def processes_naming(text: str) -> dict[int, dict[str, str]]:
    """pid -> environment of every process whose command line names `text`."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                environ = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
                found[int(proc.name)] = dict(item.partition("=")[::2] for item in environ if "=" in item)
        except OSError:  # gone meanwhile
            pass
    return found


def gone_within(text: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not processes_naming(text):
            return True
        time.sleep(0.2)
    return False


# -- workers die with their launcher -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("command", ["sweep", "comm"])
def test_a_killed_launcher_takes_torchrun_and_its_workers_with_it(tmp_path, command):
    """SIGKILL to the command (an OOM killer's, a scheduler's): nothing it started runs on, and
    the results file is free for --resume at once."""
    out = tmp_path / f"{command}-{random.randrange(1 << 30)}.jsonl"  # a name only this test's processes carry
    if command == "sweep":
        child = start(tmp_path, "sweep", str(write_spec(tmp_path)), "-o", str(out))
        wait_for(child.stdout, r"\[\s*1/\d+\]")  # a point is done: the workers are in their loop
    else:
        child = start(tmp_path, "comm", "-o", str(out), "--iters", "3000", "-e", "1M", "--paths", "nccl")
        wait_for(child.stderr, r"^comm: \d+ cases")
    assert len(processes_naming(str(out))) >= 3  # the command, torchrun, two workers (the launcher says -o)
    child.kill()
    child.wait()
    assert gone_within(str(out), 15), processes_naming(str(out))
    assert lock_free_within(out, 5)  # --resume would start (a process's files close a moment after its cmdline goes)
    assert command == "comm" or read_rows(out)  # the finished rows are intact


def lock_free_within(out: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        store = ResultStore(out)
        try:
            store.open(resume=True)
            store.close()
            return True
        except UserError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


# -- a dying worker: one paragraph, true about the rows -------------------------------------------


@pytest.mark.slow
def test_a_worker_killed_by_a_signal_gives_one_true_paragraph(tmp_path):
    out = tmp_path / f"r-{random.randrange(1 << 30)}.jsonl"
    child = start(tmp_path, "sweep", str(write_spec(tmp_path)), "-o", str(out))
    wait_for(child.stdout, r"\[\s*2/\d+\]")
    rank1 = [pid for pid, env in processes_naming(str(out)).items() if env.get("RANK") == "1"]
    assert len(rank1) == 1
    os.kill(rank1[0], signal.SIGKILL)  # what the kernel's OOM killer does
    _, err = child.communicate(timeout=120)
    assert child.returncode != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    # The kill lands within a point or between batches (each batch of this spec is two points):
    # either moment is true, and a workload being built is one no finished row has.
    moment = re.match(r"sweep failed: rank 1 was killed \(SIGKILL\) while "
                      r"(running point '|building the workload of \w+ tokens=(\d+) )", lines[0])
    assert moment, err
    rows = read_rows(out)
    assert moment[2] is None or int(moment[2]) not in {row["tokens"] for row in rows}, err
    count = len(rows)
    assert f"{count} finished rows are in {out}" in lines[0] and "--resume" in lines[0]
    log = launch_log_of(out)
    assert f"details are in {log}" in lines[0]
    assert "Traceback" not in err and "ChildFailedError" not in err
    assert "ChildFailedError" in log.read_text() or "exitcode" in log.read_text()  # torchrun's report went there


def launch_log_of(out: Path) -> Path:
    """The one launch log a failed run into `out` kept beside it (launch_log.create's name)."""
    logs = sorted(out.parent.glob(f"{out.name}.launch-*.log"))
    assert len(logs) == 1, logs
    return logs[0]


def _log(tmp_path: Path, *events: dict) -> Path:
    path = tmp_path / "run.log"
    path.write_text("== a run\nnoise from torchrun\n" + "".join(launch_log.EVENT + json.dumps(e) + "\n" for e in events))
    return path


RUNNING = {"event": "running", "what": "point 'baseline tokens=29'"}


def test_a_signal_is_named_with_the_point_and_torchruns_sigterm_is_not_the_cause(tmp_path):
    log = _log(tmp_path, RUNNING, {"event": "error", "rank": 0, "error": "RuntimeError: Connection reset by peer"},
               {"event": "ended", "rank": 0, "exitcode": -15}, {"event": "ended", "rank": 1, "exitcode": -11})
    text = launch_log.explain(log, None)
    assert text.startswith("rank 1 died of SIGSEGV while running point 'baseline tokens=29'") and str(log) in text


def test_out_of_memory_is_said_when_the_kernel_counted_a_kill(tmp_path, monkeypatch):
    log = _log(tmp_path, RUNNING, {"event": "ended", "rank": 1, "exitcode": -9})
    monkeypatch.setattr(launch_log, "oom_kills", lambda: 8)
    text = launch_log.explain(log, 7, "this run needs about 140.2 GiB per process, 2 processes")
    assert text.startswith("host memory ran out while running point 'baseline tokens=29': the kernel's "
                           "out-of-memory killer ended rank 1 (this run needs about 140.2 GiB per process")
    assert "Make the study smaller" in text
    unsure = launch_log.explain(log, 8)  # no kill counted: a SIGKILL of unknown origin
    assert unsure.startswith("rank 1 was killed (SIGKILL) while running point") and "or by another process" in unsure


def test_a_time_limit_and_an_error_and_bad_input(tmp_path):
    timeout = {"event": "timeout", "rank": 1, "what": "point 'fault tokens=29'", "limit_s": 15}
    text = launch_log.explain(_log(tmp_path, RUNNING, timeout, {"event": "ended", "rank": 1, "exitcode": 3}), None)
    assert text.startswith("rank 1: point 'fault tokens=29' ran longer than 15 s (measure.timeout_s)") and "stack" in text
    error = {"event": "error", "rank": 0, "error": "KeyError: 'x'"}
    text = launch_log.explain(_log(tmp_path, RUNNING, error, {"event": "ended", "rank": 0, "exitcode": 1}), None)
    assert "unexpected error while running point 'baseline tokens=29': KeyError: 'x'" in text
    assert launch_log.explain(_log(tmp_path, {"event": "ended", "rank": 0, "exitcode": 2}), None) is None  # it said so


def test_what_is_kept_is_said_truly(tmp_path):
    out = tmp_path / "r.jsonl"
    assert kept(out, "--resume continues") == f"no rows were written to {out}"  # no promise to continue nothing
    synthetic.write(out, [synthetic.row("baseline", 1024, rng=random.Random(1))])
    assert kept(out, "--resume continues") == f"1 finished row is in {out}; --resume continues"


def test_interrupted_with_no_rows_promises_nothing():
    from overlapbench.run.command import interrupted

    missing = Path("/nonexistent/r.jsonl")
    assert interrupted(None, missing) == f"interrupted; no rows were written to {missing}"


# -- a study too big for the machine is refused before it starts ----------------------------------


def test_a_gpu_sized_spec_is_refused_on_cpu_with_its_size():
    from overlapbench.specs import spec

    points = len(spec.load("sweeps/llama3-8b-tp2.yaml", cuda=False).points(2, cuda=False))  # the study as a CPU would run it
    line = one_line_error(overlapbench("sweep", "sweeps/llama3-8b-tp2.yaml", "-o", "/nonexistent/x.jsonl"))
    assert "sweeps/llama3-8b-tp2.yaml: " in line and f"{points} points" in line and "GiB of weights" in line
    assert "cpu: section" in line and "--force" in line


def _loaded(text: str, world: int = 2):
    loaded = spec.from_dict(yaml.safe_load(text), "s", cuda=False)
    return loaded, loaded.points(world, cuda=False)


def test_the_size_check_refuses_memory_and_gpu_sized_arithmetic(monkeypatch):
    big, points = _loaded("model: llama3-70b\nlayers: 80\ntokens: [128]\nstrategies: [baseline]\n")
    size = footprint.estimate(big, points, cuda=False)
    assert size.weights_bytes > 100 * 2**30  # 80 layers of a 70B model's half, built in fp32
    monkeypatch.setattr(footprint, "host_memory_bytes", lambda: 23 * 2**30)
    with pytest.raises(UserError, match=r"needs about \d+\.\d GiB of host memory for 2 processes, and this machine has 23.0 GiB"):
        footprint.check(big, size, 2, cuda=False, gpu_bytes=None)
    monkeypatch.setattr(footprint, "host_memory_bytes", lambda: 1 << 50)
    with pytest.raises(UserError, match="sized for GPUs"):  # it fits, but no CPU does that arithmetic in minutes
        footprint.check(big, size, 2, cuda=False, gpu_bytes=None)
    tailored, points = _loaded("model: llama3-70b\nlayers: 80\ntokens: [128]\nstrategies: [baseline]\n"
                               "cpu: {model: tiny, layers: 2, tokens: [16]}\n")
    assert footprint.check(tailored, footprint.estimate(tailored, points, False), 2, False, None) is None
    assert "more than the 80.0 GiB" in footprint.check(big, size, 2, cuda=True, gpu_bytes=80 * 2**30)


def test_the_weights_estimate_is_the_stack_a_rank_builds():
    import torch

    from overlapbench.model.weights import build_stack

    for text in ("model: tiny\nlayers: 3\ntokens: [8]\nstrategies: [baseline]\n",
                 "model: tiny-moe\nlayers: 2\ntokens: [8]\nstrategies: [baseline]\n"):
        loaded, points = _loaded(text)
        stack = build_stack(points[0].shape, points[0].layers, 2, 0, torch.float32, torch.device("cpu"))
        built = sum(t.numel() for w in stack.layers for name, t in vars(w).items()
                    if t is not None and "norm" not in name)
        assert footprint.estimate(loaded, points, cuda=False).weights_bytes == built * 4


# -- commands that would do nothing say so ------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--beside-gemm"], "--beside-gemm: times each path beside a bf16 GEMM stream on CUDA GPUs"),
    (["--paths", "symm_one_shot,copy_engine"], "--paths: nothing would run on this machine"),
])
def test_comm_that_would_only_skip_is_refused_on_cpu(tmp_path, args, words):
    out = tmp_path / "c.jsonl"
    assert words in one_line_error(overlapbench("comm", "-o", str(out), *args))
    assert not out.exists()


@pytest.mark.slow
def test_a_resume_with_every_point_done_launches_nothing_and_a_clean_run_leaves_only_its_rows(tmp_path):
    """And the user's own files beside the results stay as they are: `-o r.jsonl >> r.log 2>&1`,
    the usual way to keep a log, keeps it."""
    path, out, mine = write_spec(tmp_path, tokens=[16]), tmp_path / "r.jsonl", tmp_path / "r.log"
    mine.write_text("the user's own line\n")
    with open(mine, "a") as redirect:
        first = subprocess.run([sys.executable, "-m", "overlapbench", "sweep", str(path), "-o", str(out)], cwd=REPO,
                               env=os.environ | {"PYTHONPATH": str(REPO)}, stdout=redirect, stderr=subprocess.STDOUT)
    assert first.returncode == 0, mine.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.yaml", "r.jsonl", "r.log"]  # no .lock, no launch log
    kept = mine.read_text()
    assert kept.startswith("the user's own line\n") and f"wrote 2 rows to {out}" in kept
    again = overlapbench("sweep", str(path), "-o", str(out), "--resume")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"{out}: every point of long (2) is done already; nothing to run"
    assert len(read_rows(out)) == 2


# -- one results file, one study ------------------------------------------------------------------


def comm_rows(path: Path) -> Path:
    rows = [{"schema": SCHEMA, "spec": "comm", "workload": "comm", "status": "ok", "key": f"c{i}", "ms": 0.5 + i}
            for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_resume_refuses_another_studys_file(tmp_path):
    sweep_file = synthetic.write(tmp_path / "s.jsonl", [synthetic.row("baseline", 1024, rng=random.Random(2))])
    before = sweep_file.read_text()
    line = one_line_error(overlapbench("sweep", str(write_spec(tmp_path, "mine")), "-o", str(sweep_file), "--resume"))
    assert f"--resume: {sweep_file} holds the rows of spec 'synthetic', not of spec 'mine'" in line
    line = one_line_error(overlapbench("comm", "-o", str(sweep_file), "--resume"))
    assert "holds the rows of spec 'synthetic', not of `overlapbench comm`" in line
    assert sweep_file.read_text() == before  # nothing written
    line = one_line_error(overlapbench("sweep", str(write_spec(tmp_path)), "-o", str(comm_rows(tmp_path / "c.jsonl")),
                                       "--resume"))
    assert "holds the rows of `overlapbench comm`, not of spec 'long'" in line


def test_tune_reads_the_newest_sweep_not_a_newer_comm_file(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    rng = random.Random(3)
    rows = [synthetic.row(s, 1024, rng=rng) for s in ("baseline", "token_split")]
    sweep_file = synthetic.write(results / "mine.jsonl", rows)
    newer = comm_rows(results / "comm-cpu-2.jsonl")
    os.utime(sweep_file, (time.time() - 60, time.time() - 60))
    result = overlapbench("tune", "--out-dir", str(tmp_path / "tuned"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"reading {Path('results') / 'mine.jsonl'}" in result.stderr
    line = one_line_error(overlapbench("tune", str(newer), cwd=tmp_path))
    assert "holds comm rows, which tune does not choose from" in line and "overlapbench report" in line


def test_the_lock_goes_with_the_store_and_still_excludes(tmp_path, monkeypatch):
    out = tmp_path / "r.jsonl"
    monkeypatch.setattr(sys, "argv", ["overlapbench", "sweep", "my spec.yaml", "-o", str(out)])  # the holder's command
    first = ResultStore(out)
    first.open(resume=False)
    assert first.lock_path.exists()
    command = re.escape(shlex.join(["overlapbench", "sweep", "my spec.yaml", "-o", str(out)]))
    holder = rf"\(pid {os.getpid()}: {command}, since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\)"
    with pytest.raises(UserError, match=rf"output: {re.escape(str(out))} is being written by another run {holder}; "
                                        rf"wait for it to end, or choose another --output"):
        ResultStore(out).open(resume=False)
    first.close()
    assert not first.lock_path.exists()
    second = ResultStore(out)
    assert second.open(resume=False) == set()
    second.close()


def test_a_second_run_into_a_busy_file_is_refused_at_once_naming_the_first(tmp_path, monkeypatch):
    """The launcher holds the lock from its checks to its end (held_for_launch), so a second run is
    refused before it launches anything, with who holds the file; the first one's workers write
    under the lock held for them."""
    from overlapbench.tuning.results import HELD_FOR, held_for_launch

    out = tmp_path / "r.jsonl"
    monkeypatch.setattr(sys, "argv", ["overlapbench", "sweep", "first.yaml", "-o", str(out)])  # the holder's command
    with held_for_launch(out, resume=False, study="long"):
        line = one_line_error(overlapbench("sweep", str(write_spec(tmp_path)), "-o", str(out)))
        command = shlex.join(["overlapbench", "sweep", "first.yaml", "-o", str(out)])
        assert f"output: {out} is being written by another run (pid {os.getpid()}: {command}, since " in line
        assert "wait for it to end, or choose another --output" in line
        worker = ResultStore(out)  # as a worker of this launcher opens it: HELD_FOR names the lock
        assert os.environ[HELD_FOR] == str(worker.lock_path.resolve())
        with pytest.raises(UserError, match="is being written by another run"):  # not under torchrun: refused
            worker.open(resume=False)
        monkeypatch.setenv("RANK", "0")
        assert worker.open(resume=False) == set()
        worker.close()
        assert worker.lock_path.exists()  # still the launcher's
    assert not worker.lock_path.exists() and HELD_FOR not in os.environ


@pytest.mark.slow
def test_results_named_like_a_log_in_an_empty_folder(tmp_path):
    out = tmp_path / "run.log"
    done = overlapbench("sweep", str(write_spec(tmp_path, tokens=[16])), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(read_rows(out)) == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["long.yaml", "run.log"]


def test_the_launch_log_never_takes_an_existing_name(tmp_path):
    out = tmp_path / "sub" / "c.jsonl"
    first, second = launch_log.create(out), launch_log.create(out)
    assert first != second and first.parent == out.parent and first.name.startswith("c.jsonl.launch-")
    assert first.name.endswith(".log") and first.read_text() == second.read_text() == ""
    (tmp_path / "sub" / "c.log").write_text("mine")
    assert launch_log.create(out).name != "c.log" and (tmp_path / "sub" / "c.log").read_text() == "mine"


def test_the_paragraph_names_the_phase_and_a_death_at_exit(tmp_path):
    phase = {"event": "phase", "rank": 1, "phase": "capturing"}
    running = {"event": "running", "what": "point 'fault tokens=29'", "rank": 1}
    text = launch_log.explain(_log(tmp_path, running, phase, {"event": "ended", "rank": 1, "exitcode": -6}), None)
    assert text.startswith("rank 1 died of SIGABRT while running point 'fault tokens=29' (capturing): ")
    later = {"event": "running", "what": "point 'fault tokens=40'", "rank": 1}  # a phase belongs to its point
    text = launch_log.explain(_log(tmp_path, running, phase, later, {"event": "ended", "rank": 1, "exitcode": -6}), None)
    assert "while running point 'fault tokens=40': " in text
    interleaved = {"event": "running", "what": "timing 2 candidates at 32768 tokens interleaved", "rank": 0}
    finished = {"event": "finished", "rank": 0}
    text = launch_log.explain(_log(tmp_path, interleaved, finished, {"event": "ended", "rank": 0, "exitcode": -6},
                                   {"event": "ended", "rank": 1, "exitcode": -6}), None)
    assert text.startswith("rank 0 died of SIGABRT at exit, after all rows were written: "), text
    killed = launch_log.explain(_log(tmp_path, running, phase), None, code=128 + 9)  # torchrun itself: no `ended` events
    assert killed.startswith("torchrun (between this command and its workers) was ended by SIGKILL while running "
                             "point 'fault tokens=29' (capturing), and its workers with it")


def test_tune_says_what_a_tuned_file_it_replaces_held(tmp_path):
    rng = random.Random(5)

    def store(name: str, faster: float, run_id: str) -> Path:
        rows = []
        for tokens in (1024, 4096):
            rows.append(synthetic.row("baseline", tokens, samples=synthetic.draw(tokens / 1000, 0.01, rng), run_id=run_id))
            rows.append(synthetic.row("token_split", tokens, {"split_offset": 128}, run_id=run_id,
                                      samples=synthetic.draw(tokens / 1000 * faster, 0.01, rng)))
        return synthetic.write(tmp_path / name, rows)

    out_dir = tmp_path / "tuned"
    first = overlapbench("tune", str(store("a.jsonl", 0.8, "runa")), "--out-dir", str(out_dir))
    assert first.returncode == 0 and "replacing" not in first.stdout, first.stderr
    second = overlapbench("tune", str(store("b.jsonl", 1.0, "runb")), "--out-dir", str(out_dir))
    assert second.returncode == 0, second.stderr
    line = next(line for line in second.stdout.splitlines() if line.startswith("wrote "))
    assert line.endswith(" (replacing the config it held: runs runa: 1-4096 token_split)"), second.stdout


@pytest.mark.parametrize(("gpus", "spec_tp", "ranks"), [
    (4, 2, 2),  # a tp: 2 spec on a 4-GPU machine: 2 of its GPUs, not a refusal
    (4, 4, 4), (4, "auto", 4), (8, 1, 1),
    (0, 1, 1), (0, "auto", 2), (0, 4, 2),  # without GPUs: 2 gloo processes unless the spec asks for fewer
])
def test_a_sweep_launches_the_specs_tp_where_the_machine_holds_it(monkeypatch, gpus, spec_tp, ranks):
    from overlapbench.launch import launch

    monkeypatch.setattr(launch, "local_gpus", lambda: gpus)
    assert launch.default_nproc(spec_tp) == ranks
    assert launch.default_nproc() == (gpus or 2)  # no spec (comm): the machine's


def test_a_spec_asking_more_gpus_than_the_machine_has_is_refused_naming_both(monkeypatch):
    from overlapbench.launch import launch

    gpus = random.randrange(1, 8)
    tp = gpus + random.randrange(1, 8)
    monkeypatch.setattr(launch, "local_gpus", lambda: gpus)
    with pytest.raises(UserError, match=f"tp: {tp} needs {tp} GPUs and this machine has {gpus}; .*--nproc {tp}"):
        launch.default_nproc(tp)


def test_a_tp_1_spec_runs_on_one_process_without_nproc(tmp_path):
    """Started plainly with no --nproc, a `tp: 1` spec launches one process (2 gloo processes
    would be refused by the spec's own tp check)."""
    path = write_spec(tmp_path, "one", tokens=[16], tp=1)
    out = tmp_path / "r.jsonl"
    done = overlapbench("sweep", str(path), "-o", str(out), timeout=300)
    assert done.returncode == 0, done.stderr
    rows = read_rows(out)
    assert rows and all(len(r["ranks"]) == 1 for r in rows), [r["ranks"] for r in rows]


def test_a_rank_whose_limit_fires_writes_where_it_was_then_waits_for_the_others_to(tmp_path, monkeypatch):
    """Which rank's time limit fires first is a race; its exit has torchrun stop the others. So it
    writes its stack to the launch log, then lives STACKS_GRACE_S more, in which the other ranks'
    limits (the hung rank's among them) fire and write theirs, and only then exits; a block that
    ends in that grace goes no further."""
    import threading
    from types import SimpleNamespace

    from overlapbench.launch import watchdog

    log = tmp_path / "r.jsonl.launch-1.log"
    log.write_text("== the launcher's header\n")
    monkeypatch.setenv(launch_log.LOG, str(log))
    done, graced = [], threading.Event()

    def wait(s: float) -> None:
        done.append(("waited", s, log.read_text()))
        graced.wait(10)

    def exit_(code: int) -> None:  # the limit's thread then ends; the process goes on
        done.append(("exit", code))

    monkeypatch.setattr(watchdog, "time", SimpleNamespace(sleep=wait))
    monkeypatch.setattr(watchdog, "os", SimpleNamespace(_exit=exit_))
    rank, limit = random.randrange(8), random.uniform(0.01, 0.05)
    dog, passed = watchdog.Watchdog(limit, rank), []

    def point() -> None:
        with dog.guard("point 'x tokens=29'"):
            while not done:  # a point that only ran long: it ends once its limit has fired
                time.sleep(0.005)
        passed.append("the next point")

    runner = threading.Thread(target=point, daemon=True)  # left blocked: the process would have ended
    runner.start()
    runner.join(2)
    assert runner.is_alive() and not passed  # it waits for the end, not the next point
    graced.set()
    for _ in range(200):
        if len(done) == 2:
            break
        time.sleep(0.01)
    (waited, grace, written), last = done
    assert (waited, grace, last) == ("waited", watchdog.STACKS_GRACE_S, ("exit", watchdog.TIMED_OUT))
    assert f"rank {rank}: point 'x tokens=29' ran longer than {limit:g} s (measure.timeout_s); where it was:" in written
    assert "in point" in written  # the stacks, the point's thread among them, before the wait
    assert watchdog.STACKS_GRACE_S >= 1  # ranks reach a point up to seconds apart under load
    assert [e["event"] for e in launch_log.events(log)] == ["running", "timeout"] and runner.is_alive() and not passed
