"""Run folders under faults and bad input, through the command line: --resume refuses a checkpoint trained with
other settings; a fresh run never replaces a run unasked and, with --overwrite, never leaves a folder that looks
finished; a torn log line or a leftover of a killed write is recovered from; a damaged checkpoint is refused in
one line; the method files refuse another --method; bad settings give one line, exit 2, and create nothing."""

import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import kernel_sparse
import sbm_transformer
import ssa
from bench import train as harness
from bench.files import folder_problem, load_checkpoint, write_json
from conftest import ROOT, exit_code, valid_steps
from test_train import TINY, env, record, train_here

BASE = ["--task", "duplicates", *TINY]
RUN = [*BASE, "--steps", "6", "--eval-every", "3"]  # a later occurrence of an option overrides these


def run_of(entry):
    """RUN for an entry point: kernel_sparse.py trains the masked LM only, so its task is wikitext2."""
    return ["--task", "wikitext2", *RUN[2:]] if entry is kernel_sparse.main else RUN


def tree(folder):
    """Every path under ``folder`` with its bytes (None for folders): what a refused command must not change."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


def one_line_error(result, code=2):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "error: " in lines[-1], result.stderr
    return lines[-1]


def refused(capsys, *argv, entry=harness.main, code=2):
    """An entry point's main() run in this process (a refusal trains nothing): its exit code must be ``code``
    and its message one line; returns that line."""
    result = exit_code(entry, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert result == code and err and "error: " in err[-1], (result, err)
    return err[-1]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished run (6 steps, checkpoints at 3 and 6, a snapshot at 3), copied by the tests that need one."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train_here(*RUN, "--snapshot-at", "3", "--out", str(out))
    return out


def copy_of(finished, tmp_path):
    return Path(shutil.copytree(finished, tmp_path / "run"))


# ------------------------------------------------------------------------------------ resume settings
def test_resume_refuses_a_checkpoint_trained_with_other_settings_naming_each(tmp_path, finished, capsys):
    out = copy_of(finished, tmp_path)
    before = tree(tmp_path)
    for changed, named in [
        (["--seed", "7", "--steps", "30", "--lr", "0.01"], ["--seed 0 → 7", "--lr 0.001 → 0.01", "--steps 6 → 30"]),
        (["--method", "linear"], ['--method "full" → "linear"']),
        (["--attn", "path=reference"], ['--attn {} → {"path": "reference"}']),
        (["--dropout", "0.2", "--grad-clip", "0.5"], ["--dropout 0.0 → 0.2", "--grad-clip 1.0 → 0.5"]),
        (["--steps", "4"], ["--steps 6 → 4"]),
    ]:
        line = refused(capsys, *RUN, *changed, "--out", str(out), "--resume")
        assert f"{out / 'checkpoint.pt'} (step 6) was trained with other settings" in line
        for setting in named:
            assert setting in line, (setting, line)
    assert tree(tmp_path) == before  # nothing of the run was touched


def test_resume_may_change_what_only_reports(tmp_path, capsys):
    """Observing settings may change, and the run then ends as one trained without the interruption; any other
    change (here more steps) is refused."""
    scratch, resumed = tmp_path / "scratch", tmp_path / "resumed"
    train_here(*RUN, "--steps", "9", "--out", str(scratch))
    train_here(*RUN, "--steps", "9", "--snapshot-at", "6", "--out", str(resumed))
    shutil.copyfile(resumed / "checkpoint-6.pt", resumed / "checkpoint.pt")  # as if killed after step 6
    train_here(
        *RUN,
        "--steps",
        "9",
        "--log-every",
        "1",
        "--final-eval-batches",
        "3",
        "--eval-every",
        "1",
        "--snapshot-at",
        "8",
        "--device",
        "cpu",
        "--out",
        str(resumed),
        "--resume",
    )
    a, b = record(scratch), record(resumed)
    assert a["param_fingerprints"] == b["param_fingerprints"] and b["steps"] == 9
    assert valid_steps(resumed / "log.jsonl") == [3, 6, 7, 8, 9]
    grown = refused(capsys, *RUN, "--steps", "12", "--out", str(scratch), "--resume")
    assert "--steps 9 → 12" in grown


# ------------------------------------------------------------------------------------ fresh runs
def test_a_fresh_run_refuses_a_folder_holding_a_run_unless_told_to_overwrite(tmp_path, finished, capsys):
    out = copy_of(finished, tmp_path)
    (out / "train.log").write_text("a caller's log\n")
    before = tree(tmp_path)
    line = refused(capsys, *RUN, "--seed", "1", "--out", str(out))
    assert line == (
        f"error: {out} already holds a run (metrics.json, checkpoint.pt, log.jsonl, checkpoint-3.pt): "
        f"continue it with --resume, or replace it with --overwrite"
    )
    # with --overwrite, a run refused for bad input (here: no data) changes nothing either
    line = refused(
        capsys,
        "--task",
        "bytes",
        *TINY,
        "--steps",
        "1",
        "--data-dir",
        str(tmp_path / "none"),
        "--overwrite",
        "--out",
        str(out),
        code=1,
    )
    assert "no WikiText-2 text" in line and tree(tmp_path) == before
    train_here(*RUN, "--seed", "1", "--out", str(out), "--overwrite")
    assert record(out)["seed"] == 1 and load_checkpoint(out / "checkpoint.pt")["config"]["seed"] == 1
    assert (out / "train.log").read_text() == "a caller's log\n"  # not a file of the run


def test_a_run_finished_during_a_slow_setup_is_not_replaced(tmp_path, monkeypatch, capsys):
    """The folder is checked again under its lock: before, a run whose setup was slow checked an empty folder,
    another run finished there meanwhile, and the first then deleted its results; both exited 0."""
    from bench import loop

    out, build_model = tmp_path / "run", loop.build_model

    def slow_setup(*args):
        monkeypatch.setattr(loop, "build_model", build_model)  # the other run sets up at the usual speed
        model = build_model(*args)
        train_here(*RUN, "--seed", "1", "--out", str(out))
        return model

    monkeypatch.setattr(loop, "build_model", slow_setup)
    line = refused(capsys, *RUN, "--out", str(out))
    assert line.startswith(f"error: {out} already holds a run (metrics.json") and record(out)["seed"] == 1


def test_an_overwriting_run_killed_early_never_leaves_a_folder_that_looks_finished(tmp_path, finished):
    """Before: the old run's complete metrics.json and checkpoint stayed beside the new run's log."""
    out = copy_of(finished, tmp_path)
    args = [
        "--task",
        "duplicates",
        *TINY,
        "--seed",
        "1",
        "--steps",
        "400",
        "--eval-every",
        "40",
        "--log-every",
        "1000",
        "--out",
        str(out),
        "--overwrite",
    ]
    old_checkpoint = (out / "checkpoint.pt").stat().st_ino
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.train", *args],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def new_checkpoint():
        try:
            return (out / "checkpoint.pt").stat().st_ino != old_checkpoint
        except FileNotFoundError:
            return False

    deadline = time.time() + 120
    while not new_checkpoint() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (out / "metrics.json").exists()
    checkpoint = load_checkpoint(out / "checkpoint.pt")
    assert checkpoint["config"]["seed"] == 1 and 40 <= checkpoint["progress"]["step"] < 400
    steps = valid_steps(out / "log.jsonl")
    step = checkpoint["progress"]["step"]
    assert steps[: step // 40] == list(range(40, step + 1, 40))  # the new run's only


# ------------------------------------------------------------------------------------ Ctrl-C
def interrupt(out, args, ready):
    """A run in a subprocess, sent SIGINT once ``ready(out)``: its exit code and the last line of its stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.train", *args, "--out", str(out)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # A shell without job control starts a background command with SIGINT ignored, and children inherit that
        # (the run then never sees the signal): give the run the disposition a terminal's Ctrl-C meets.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    try:
        while not ready(out):
            assert proc.poll() is None and time.time() < deadline, "the run ended before it could be interrupted"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()  # a failed wait leaves no run of 100,000 steps behind (no effect on one that ended)
    assert "Traceback" not in err, err
    return proc.returncode, err.strip().splitlines()[-1]


def test_ctrl_c_is_one_line_and_the_run_goes_on_as_it_says(tmp_path):
    """Before: a 40-line KeyboardInterrupt traceback and exit 1 (the data-error code)."""
    out = tmp_path / "run"
    args = [*BASE, "--steps", "300", "--eval-every", "20", "--log-every", "1000"]
    code, line = interrupt(out, args, lambda out: (out / "checkpoint.pt").exists())
    assert code == 130 and re.fullmatch(r"error: interrupted at step \d+; continue with --resume", line), line
    train_here(*args, "--out", str(out), "--resume")
    assert record(out)["status"] == "complete"


def test_ctrl_c_or_a_kill_before_the_first_checkpoint_leaves_a_folder_a_rerun_takes(tmp_path, finished, capsys):
    """Before: a folder with a log alone was refused as "holding a run: continue it with --resume", and --resume
    then found no checkpoint. A folder with a snapshot but no checkpoint is not offered --resume either."""
    out = tmp_path / "run"
    code, line = interrupt(
        out,
        [*BASE, "--steps", "100000", "--eval-every", "100000", "--log-every", "1"],
        lambda out: (out / "log.jsonl").is_file() and (out / "log.jsonl").read_text(),
    )
    assert code == 130 and re.fullmatch(
        r"error: interrupted at step \d+; nothing saved yet; rerun to start again", line
    ), line
    train_here(*RUN, "--out", str(out))
    assert record(out)["status"] == "complete"
    snapshot_only = tmp_path / "snapshot"
    snapshot_only.mkdir()
    shutil.copyfile(finished / "checkpoint-3.pt", snapshot_only / "checkpoint-3.pt")
    line = refused(capsys, *RUN, "--out", str(snapshot_only))
    assert line.endswith("(checkpoint-3.pt): it has no checkpoint: replace it with --overwrite"), line


# ------------------------------------------------------------------------------------ torn log line
def test_a_torn_log_line_and_a_leftover_partial_checkpoint_are_recovered_from(tmp_path, finished):
    """A kill mid-write leaves a log line without its newline (and a checkpoint's temporary file): before, every
    later run in the folder failed on the log."""
    out = copy_of(finished, tmp_path)
    os.replace(out / "checkpoint-3.pt", out / "checkpoint.pt")  # as if killed after step 3's checkpoint ...
    (out / "metrics.json").unlink()
    with open(out / "log.jsonl", "ab") as log:
        log.write(b'{"step": 9, "split": "val')  # ... and while a later line was being written
    (out / "checkpoint.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    train_here(*RUN, "--out", str(out), "--resume")
    assert valid_steps(out / "log.jsonl") == [3, 6]
    assert record(out)["steps"] == 6 and not list(out.glob("*.tmp"))
    with open(out / "log.jsonl", "ab") as log:
        log.write(b'{"step": 9, "split": "val')
    train_here(*RUN, "--out", str(out), "--overwrite")  # a fresh run starts a new log
    assert valid_steps(out / "log.jsonl") == [3, 6]


# ------------------------------------------------------------------------------------ damaged checkpoints
@pytest.mark.parametrize(
    "damage", ["flipped", "truncated", "empty", "not an archive", "a link to /dev/zero", "foreign"]
)
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_it(tmp_path, finished, capsys, damage):
    out = copy_of(finished, tmp_path)
    path = out / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    if damage == "flipped":  # in the middle of the weights: torch.load alone read this silently
        for i in range(len(data) // 2, len(data) // 2 + 8):
            data[i] ^= 0xFF
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = b""
    elif damage == "not an archive":
        data = b"bench.train checkpoint, sha256 of the rest: 0123\n" + data  # an older checkpoint format
    if damage == "a link to /dev/zero":  # before: read without bound
        path.unlink()
        path.symlink_to("/dev/zero")
    elif damage == "foreign":  # a whole torch file, not a run's: before, a KeyError traceback and exit 1
        torch.save({"weights": torch.zeros(2)}, path)
    else:
        path.write_bytes(bytes(data))
    line = refused(capsys, *RUN, "--out", str(out), "--resume")
    assert line.startswith(f"error: the checkpoint {path} ") and "weights_only" not in line
    assert {
        "flipped": "fails its CRC-32",
        "truncated": "is damaged",
        "empty": "is empty",
        "not an archive": "is damaged",
        "a link to /dev/zero": "is not a regular file",
        "foreign": "is not a run's checkpoint",
    }[damage] in line


def test_a_checkpoint_is_a_plain_torch_file(finished):
    """torch.load(path, weights_only=True) reads a checkpoint: model and optimizer state, step, config."""
    import torch

    state = torch.load(finished / "checkpoint.pt", weights_only=True)
    assert state["progress"]["step"] == 6 and state["config"]["steps"] == 6
    assert "blocks.0.attn.qkv.weight" in state["model"] and "state" in state["optimizer"]


# ------------------------------------------------------------------------------------ method files
@pytest.mark.parametrize("module", [sbm_transformer, ssa, kernel_sparse])
def test_method_files_take_no_method_option(tmp_path, capsys, module):
    """A method file trains its own method: --method is no option of it (python -m bench.train runs the others)."""
    task = "wikitext2" if module is kernel_sparse else "duplicates"
    line = refused(
        capsys,
        "--task",
        task,
        "--method",
        "performer",
        "--steps",
        "0",
        "--out",
        str(tmp_path / "run"),
        entry=module.main,
    )
    assert "unrecognized arguments: --method performer" in line
    assert list(tmp_path.iterdir()) == []


def test_bench_train_still_runs_a_method_file_by_name(tmp_path):
    out = tmp_path / "run"
    train_here("--method", "ssa", *BASE, "--steps", "2", "--out", str(out))
    assert record(out)["method"] == "ssa"


# ------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--device", "gpu"], 2, "argument --device: must be auto, cpu, cuda or cuda:N, got 'gpu'"),
        (["--lr", "-1"], 2, "argument --lr: must be a positive number up to 1e37, got -1"),
        (["--lr", "nan"], 2, "argument --lr: must be a positive number up to 1e37, got nan"),
        (["--lr", "1e38"], 2, "argument --lr: must be a positive number up to 1e37, got 1e38"),  # AdamW overflowed
        (["--dropout", "1"], 2, "argument --dropout: must be a rate in [0, 1), got 1"),
        (["--pos-emb", "maybe"], 2, "argument --pos-emb: must be true or false, got maybe"),
        (
            ["--method", "performer", "--attn", "features=abc"],
            2,
            "--attn features=abc: performer's features takes an integer",
        ),
        (["--method", "performer", "--attn", "features=1.5"], 2, "performer's features takes an integer"),
        (["--attn", "alibi=maybe"], 2, "error: --attn alibi=maybe: full's alibi takes true or false"),
        (["--attn", "window=3"], 2, "full takes no option 'window'; its options: ['path', 'alibi']"),
        (
            ["--method", "linformer", "--task", "bytes"],
            2,
            "linformer cannot run task bytes with these settings: LinformerAttention cannot be causal",
        ),
        (["--method", "nystromformer", "--task", "enwik8"], 2, "nystromformer cannot run task enwik8"),
        (["--resume", "--overwrite"], 2, "argument --overwrite: not allowed with argument --resume"),
        (["--task", "text", "--data-dir", "{tmp}/no/such/data"], 1, "The download failed: network unreachable (test)"),
        (["--task", "image", "--data-dir", "{tmp}/no/such/data"], 1, "The download failed: network unreachable (test)"),
        (
            ["--task", "enwik8", "--data-dir", "{tmp}/no/such/data"],
            1,
            "The download failed: network unreachable (test)",
        ),
    ],
)
def test_bad_input_is_one_line_before_anything_is_made(tmp_path, monkeypatch, capsys, args, code, message):
    """Each refused before training with one line (exit 2 for settings, 1 for data), leaving no folder: not the
    run's, not the data folder, not a cache (downloads are allowed here, and fail). The data folder is always
    one under tmp_path, so that even a run that is not refused leaves the shared data alone."""

    def unreachable(*args, **kwargs):
        raise OSError("network unreachable (test)")

    monkeypatch.setattr("urllib.request.urlopen", unreachable)
    for name in ("SPARSE_ATTN_OFFLINE", "SPARSE_ATTN_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    task = [] if "--task" in args else ["--task", "duplicates"]
    line = refused(
        capsys,
        *task,
        "--data-dir",
        str(tmp_path / "data"),
        *args,
        *TINY[2:],
        "--steps",
        "1",
        "--out",
        str(tmp_path / "out"),
        code=code,
    )
    assert message in line, line
    assert list(tmp_path.iterdir()) == []


def test_cuda_asked_for_on_a_machine_without_it_is_one_line(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = refused(capsys, *RUN, "--device", "cuda", "--out", str(tmp_path / "out"))
    assert line == "error: --device cuda was asked for, but CUDA is not available on this machine"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "out, message",
    [
        ("{file}", "argument --out: '{file}' is a file, not a folder"),
        ("{file}/run", "argument --out: '{file}/run' cannot be made: {file} is a file"),
        ("{tmp}/" + "n" * 300, "cannot be used: File name too long"),
        ("", "argument --out: must name a folder"),
        ("/sys/sparse-attn-run", "argument --out: '/sys/sparse-attn-run' cannot be written in /sys: read-only"),
    ],
    ids=["a file", "under a file", "a name too long", "empty", "read-only"],
)
def test_an_out_that_cannot_be_a_run_folder_is_one_line_before_anything(tmp_path, capsys, out, message):
    """Before: a file, a path under a file, an over-long name or a read-only place ended in a traceback after the
    whole set-up; --out '' trained into the current folder."""
    if out.startswith("/sys") and folder_problem(out) is None:
        pytest.skip("/sys is writable here")
    (tmp_path / "file").write_text("a file")
    out = out.format(file=tmp_path / "file", tmp=tmp_path)
    before, here = tree(tmp_path), sorted(Path.cwd().iterdir())
    line = refused(capsys, *RUN, "--out", out)
    assert message.format(file=tmp_path / "file") in line, line
    assert tree(tmp_path) == before and sorted(Path.cwd().iterdir()) == here


@pytest.mark.parametrize(
    "entry, args, message",
    [
        (harness.main, ["--seq-len", str(2**20 + 1)], "argument --seq-len: must be a length from 1 to 1,048,576"),
        (harness.main, ["--depth", "100000000000000000000"], "argument --depth: must be a count from 1 to 1,024"),
        (
            harness.main,
            ["--steps", "100000000000000000000"],
            "argument --steps: must be a non-negative integer from 0 to",
        ),
        (
            harness.main,
            ["--batch-size", "100000000"],
            "argument --batch-size: must be a batch size from 1 to 1,048,576",
        ),
        (harness.main, ["--seed", str(10**23)], "argument --seed: must be a seed from 0 to 4,294,967,295"),
        (
            kernel_sparse.main,
            ["--predictor-steps", "100000000000000000000"],
            "argument --predictor-steps: must be an integer from",
        ),
        (ssa.main, ["--sigma", "nan"], "argument --sigma: must be a finite number, got nan"),
        (ssa.main, ["--sigma", "0.1", "inf"], "argument --sigma: must be a finite number, got inf"),
        (sbm_transformer.main, ["--density-weight", "nan"], "argument --density-weight: must be a finite number"),
        (kernel_sparse.main, ["--threshold", "inf"], "argument --threshold: must be a finite number, got inf"),
    ],
)
def test_sizes_out_of_range_and_non_finite_settings_are_one_line(tmp_path, capsys, entry, args, message):
    """Before: sizes of 1e20 gave C++ stack traces or hung, --batch-size 1e8 was killed for memory at 18 GB, and
    NaN / inf were taken by the methods' float settings."""
    line = refused(capsys, *run_of(entry), *args, "--out", str(tmp_path / "run"), entry=entry)
    assert message in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, what, step",
    [
        (["--method", "sbm", "--path", "fast", "--steps", "6"], "the attention's input at step 2", 2),
        (["--steps", "1", "--eval-every", "1"], "the final evaluation's loss", 1),
    ],
    ids=["the sampler's input", "the last step's update"],
)
def test_every_divergence_is_recorded_as_one(tmp_path, capsys, args, what, step):
    """--lr 1e20: before, fastRG's "X must be finite" ended SBM's run in a traceback, exit 1, and no record; a
    NaN from the last step's update was recorded "complete", exit 0, with null losses."""
    out = tmp_path / "run"
    line = refused(capsys, *BASE, "--warmup", "0", "--lr", "1e20", *args, "--out", str(out), code=3)
    assert line.startswith(f"error: the run diverged: {what} is not finite")
    text = (out / "metrics.json").read_text()  # json.loads reads a bare NaN: the text is checked
    assert "NaN" not in text and {k: json.loads(text)[k] for k in ("status", "diverged_at_step")} == {
        "status": "diverged",
        "diverged_at_step": step,
    }


def test_a_record_holds_no_nan_or_infinity(tmp_path):
    """JSON has no NaN: a non-finite number in a record is written as null, so that a strict parser reads it."""
    write_json(tmp_path / "metrics.json", {"loss": math.nan, "per_layer": [math.inf, 1.0], "lr": {"peak": -math.inf}})

    def strict(constant):
        raise ValueError(f"{constant} is not JSON")

    text = (tmp_path / "metrics.json").read_text()
    assert json.loads(text, parse_constant=strict) == {"loss": None, "per_layer": [None, 1.0], "lr": {"peak": None}}


def test_settings_dataclass_refuses_a_non_finite_sigma():
    for sigma in [(float("nan"),), (0.1, float("inf"))]:
        with pytest.raises(ValueError, match="sigma must be finite"):
            ssa.SSAConfig(sigma=sigma)


def test_a_run_whose_activations_cannot_fit_in_memory_is_refused_up_front(tmp_path, capsys):
    line = refused(capsys, *RUN, "--seq-len", "4096", "--batch-size", "1048576", "--out", str(tmp_path / "run"))
    assert "--batch-size 1048576 × --seq-len 4096 (depth 1, width 16) needs at least" in line
    assert "GiB for the activations alone, more than the" in line and list(tmp_path.iterdir()) == []


def test_no_space_left_while_writing_a_checkpoint_is_one_line_and_keeps_the_folder_whole(tmp_path, monkeypatch, capsys):
    """Before: a traceback. Now one line, exit 1; the checkpoint's temporary file is gone, the log intact."""

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "run"
    line = refused(capsys, *RUN, "--out", str(out), code=1)
    assert (
        line == f"error: cannot write {out / 'checkpoint.pt'}: No space left on device; what was there before is kept"
    )
    assert sorted(p.name for p in out.iterdir()) == ["log.jsonl", "run.lock"]
    assert valid_steps(out / "log.jsonl") == [3]


def test_a_checkpoint_over_the_file_size_limit_is_one_line(tmp_path):
    """EFBIG (a file-size limit, ulimit -f) while the checkpoint is written: one line, exit 1, no partial file."""
    import resource

    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "bench.train", *RUN, "--out", str(out)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000)),
    )
    line = one_line_error(result, code=1)
    assert line == f"error: cannot write {out / 'checkpoint.pt'}: File too large; what was there before is kept"
    assert not list(out.glob("*.tmp")) and not (out / "checkpoint.pt").exists()
