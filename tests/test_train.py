"""bench/train.py through its command line: resume after a real kill, 2-process DDP and a run holding
the lock that refuses a second, each in a subprocess; the other paths (a smoke run, a diverged run's
exit code, --steps 0, --help, clear errors for bad input) through main() in this process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import train as harness
from bench.files import Progress, load_checkpoint
from bench.tasks import TASKS
from bench.tasks.synthetic import ListOps
from conftest import DATA as SHARED_DATA, ROOT, exit_code, valid_steps

TINY = [
    "--seq-len",
    "16",
    "--dim",
    "16",
    "--heads",
    "2",
    "--head-dim",
    "8",
    "--mlp-dim",
    "16",
    "--depth",
    "1",
    "--batch-size",
    "4",
    "--eval-batches",
    "2",
    "--final-eval-batches",
    "2",
    "--warmup",
    "2",
]


def env():
    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", SPARSE_ATTN_OFFLINE="1")
    e.pop("WORLD_SIZE", None)
    return e


def train_here(*args) -> None:
    """A run through bench.train's main(args) in this process (no process boundary in question)."""
    code = exit_code(harness.main, args)
    assert code == 0, f"exit {code}"


def in_process(capsys, monkeypatch, tmp_path, *args):
    """bench.train's main(args) in this process, from an empty current folder and with the
    environment env() gives a subprocess: (exit code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPARSE_ATTN_OFFLINE", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code = exit_code(harness.main, args)
    out, err = capsys.readouterr()
    return code, out, err


def record(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def test_duplicates_run_writes_the_results_record(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    code, stdout, _ = in_process(
        capsys,
        monkeypatch,
        tmp_path,
        "--method",
        "full",
        "--task",
        "duplicates",
        *TINY,
        "--steps",
        "6",
        "--eval-every",
        "3",
        "--log-every",
        "2",
        "--out",
        str(out),
    )
    assert code == 0 and "step 6/6" in stdout and "ms/step" in stdout and "ETA" in stdout
    rec = record(out)
    for field in (
        "method",
        "task",
        "seed",
        "device",
        "valid",
        "test",
        "density",
        "density_per_layer",
        "params",
        "flops_per_example",
        "peak_memory_bytes",
        "median_step_ms",
        "steps",
        "wall_time_s",
        "versions",
        "config",
    ):
        assert field in rec, field
    assert rec["method"] == "full" and rec["task"] == "duplicates" and rec["steps"] == 6
    assert 0 <= rec["test"] <= 1 and rec["density"] == 1.0
    assert rec["flops_per_example"]["model"] > rec["flops_per_example"]["attention"] > 0
    assert rec["peak_memory_bytes"] > 0
    assert valid_steps(out / "log.jsonl") == [3, 6]
    assert (out / "checkpoint.pt").exists()
    ckpt = load_checkpoint(out / "checkpoint.pt")
    assert ckpt["progress"]["step"] == 6


class SmallListOps(ListOps):
    """The CPU preset's 24,000 examples take seconds to generate; 8 a split are scored here."""

    def __init__(self):
        super().__init__()
        self.sizes = {"train": 100, "valid": 50, "test": 50}


def test_steps_zero_evaluates_the_untrained_model(tmp_path, monkeypatch):
    monkeypatch.setitem(TASKS, "listops", "test_train:SmallListOps")
    out = tmp_path / "zero"
    train_here("--task", "listops", *TINY, "--seq-len", "64", "--steps", "0", "--out", str(out))
    rec = record(out)
    assert rec["steps"] == 0 and rec["median_step_ms"] is None and 0 <= rec["test"] <= 1


@pytest.mark.skipif(not (SHARED_DATA / "wikitext-2" / "valid.txt").exists(), reason="WikiText-2 copy absent")
def test_bytes_lm_reports_bits_per_byte(tmp_path):
    out = tmp_path / "lm"
    train_here(
        "--task",
        "bytes",
        *TINY,
        "--eval-context",
        "8",
        "--steps",
        "3",
        "--eval-every",
        "3",
        "--data-dir",
        str(SHARED_DATA),
        "--out",
        str(out),
    )
    rec = record(out)
    assert rec["metric"] == "bpb" and 0 < rec["test"] < 12


def test_bytes_on_any_local_file_and_attention_options(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "lm"
    train_here(
        "--task",
        "bytes",
        *TINY,
        "--steps",
        "2",
        "--data-file",
        str(text),
        "--attn",
        "path=reference",
        "--attn",
        "alibi=true",
        "--pos-emb",
        "false",
        "--out",
        str(out),
    )
    rec = record(out)
    assert rec["config"]["attn"] == {"path": "reference", "alibi": True} and rec["config"]["pos_emb"] is False


def kill_when_checkpointed(args: list, out: Path, after: int) -> int:
    """Starts a run (resuming when ``out`` holds a checkpoint), SIGKILLs it once its checkpoint's step passes
    ``after``; returns that step."""
    resume = ["--resume"] if (out / "checkpoint.pt").exists() else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.train", *args, "--out", str(out), *resume],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        if (out / "checkpoint.pt").exists() and load_checkpoint(out / "checkpoint.pt")["progress"]["step"] > after:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "metrics.json").exists(), "the run finished before it could be killed"
    return load_checkpoint(out / "checkpoint.pt")["progress"]["step"]


@pytest.mark.on_device
def test_a_checkpoint_loaded_onto_the_device_resumes_beside_the_new_steps(device):
    """A resumed run's densities stack with the new steps' at the end: a checkpoint loaded onto a CUDA device once
    left them there, and the run failed at its record after its last step."""
    saved = Progress(step=2, step_times=[1.0, 1.0], train_density=[torch.full((2,), 0.5, device=device)] * 2)
    resumed = Progress.of(saved.state())
    resumed.train_density += [torch.full((2,), 0.25)] * 2  # as loop.py appends each step's
    assert torch.stack(resumed.train_density).mean(0).tolist() == [0.375, 0.375]


def test_resume_after_a_kill_ends_with_the_metrics_of_an_uninterrupted_run(tmp_path):
    """Every field of the record but the measured times and memory equals the uninterrupted run's, after two kills
    (one before and one after SSA's dense tail begins, at step 100, so that a training density of the steps since
    the last resume alone would show), after a kill inside the final write of metrics.json, and after a --resume
    of the finished run. The kills are of processes; the resumes run in this process."""
    steps, dense_from = 200, 100
    args = [
        "--method",
        "ssa",
        "--finetune-fraction",
        "0.5",
        "--task",
        "duplicates",
        *TINY,
        "--dropout",
        "0.1",
        "--steps",
        str(steps),
        "--eval-every",
        "20",
        "--log-every",
        "1000",
    ]
    full = tmp_path / "full"
    train_here(*args, "--out", str(full))

    killed = tmp_path / "killed"
    first = kill_when_checkpointed(args, killed, 0)
    second = kill_when_checkpointed(args, killed, max(first, dense_from))
    assert 0 < first < dense_from <= second < steps
    train_here(*args, "--out", str(killed), "--resume")
    (killed / "metrics.json").rename(killed / "metrics.json.x1y2z3.tmp")  # a kill inside the final write
    (killed / "metrics.json.x1y2z3.tmp").write_text('{"status": "comp')
    a = record(full)
    measured = {
        "wall_time_s",
        "train_time_s",
        "median_step_ms",
        "peak_memory_bytes",
        "inference_memory_per_example_bytes",
        "config",
    }
    for again in ("after a kill in the final write", "of the finished run"):
        train_here(*args, "--out", str(killed), "--resume")
        b = record(killed)
        assert {k: v for k, v in a.items() if k not in measured} == {k: v for k, v in b.items() if k not in measured}, (
            again
        )
        assert {**a["config"], "out": None, "resume": None} == {**b["config"], "out": None, "resume": None}, again
        assert b["peak_memory_bytes"] > 2**20 and b["median_step_ms"] > 0 and set(a) == set(b), again
        sampled_then_dense = (0.25 * dense_from + 1.0 * (steps - dense_from)) / steps
        assert b["train_density"] == pytest.approx(sampled_then_dense), again
    assert not list(killed.glob("*.tmp"))
    assert valid_steps(killed / "log.jsonl") == list(range(20, steps + 1, 20))


def test_two_process_ddp_keeps_identical_weights(tmp_path):
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29533",
        "-m",
        "bench.train",
        "--task",
        "duplicates",
        *TINY,
        "--steps",
        "5",
        "--eval-every",
        "5",
        "--out",
        str(out),
    ]
    result = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rec = record(out)
    assert rec["world_size"] == 2
    fingerprints = rec["param_fingerprints"]
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]
    # the fingerprint is of the weights that were trained: it matches the checkpoint's
    from bench.files import parameter_fingerprint
    from bench.model import Model, ModelConfig
    from baselines.full import FullAttention

    state = load_checkpoint(out / "checkpoint.pt")["model"]
    cfg = ModelConfig(
        vocab_size=17, num_classes=2, head="token", max_len=16, dim=16, depth=1, heads=2, head_dim=8, mlp_dim=16
    )
    model = Model(cfg, lambda layer: FullAttention(16, 2, 8))
    model.load_state_dict(state)
    assert parameter_fingerprint(model) == fingerprints[0]
    assert result.stdout.count("final:") == 1  # rank-0 logging only
    assert "5 steps of batch 4 in each of 2 processes at length 16" in result.stdout.splitlines()[0]


def test_learning_rate_warms_up_then_decays_to_its_floor_at_the_last_step():
    from bench.config import lr_at

    config = {"lr": 2.0, "warmup": 10, "steps": 110, "lr_decay": "cosine", "lr_floor": 0.1}
    assert lr_at(0, config) == pytest.approx(0.2) and lr_at(9, config) == pytest.approx(2.0)
    assert lr_at(10, config) == pytest.approx(2.0) and lr_at(110, config) == pytest.approx(0.2)
    assert lr_at(35, config) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5 * (1 + 2**-0.5)))  # a quarter: cos(π/4)
    linear = {**config, "lr_decay": "linear", "lr_floor": 0.5}  # the SSA paper's App. B.1 shape
    assert lr_at(35, linear) == pytest.approx(2.0 * (0.5 + 0.5 * 0.75)) and lr_at(110, linear) == pytest.approx(1.0)
    assert [lr_at(s, linear) for s in range(10, 111)] == sorted(
        (lr_at(s, linear) for s in range(10, 111)), reverse=True
    )


def test_help_lists_the_options(capsys, monkeypatch, tmp_path):
    code, out, _ = in_process(capsys, monkeypatch, tmp_path, "--help")
    assert code == 0
    for option in ("--method", "--task", "--steps", "--seed", "--resume", "--attn", "--device", "--out"):
        assert option in out
    assert "  performer: features, redraw_interval, chunk\n" in out and "  window: window, density," in out


def test_a_method_s_final_lines_compare_it_with_the_base_rate_and_full_attention_at_its_settings(
    capsys, monkeypatch, tmp_path
):
    """Without full attention's record beside it, the command that makes one; with it, its test figure."""
    run = ("--task", "duplicates", *TINY, "--steps", "4", "--eval-every", "4")
    code, out, _ = in_process(capsys, monkeypatch, tmp_path, "--method", "window", *run)
    assert code == 0
    last = out.splitlines()[-1]
    assert last.startswith("compare: base rate ") and last.endswith(
        "; full attention: python -m bench.train --method full --task duplicates --preset cpu --seed 0 --dim 16 "
        "--depth 1 --heads 2 --head-dim 8 --mlp-dim 16 --seq-len 16 --steps 4 --batch-size 4 --warmup 2 --eval-every 4 "
        "--eval-batches 2 --final-eval-batches 2"
    )
    code, _, _ = in_process(capsys, monkeypatch, tmp_path, "--method", "full", *run)
    full = record(tmp_path / "runs" / "full-duplicates-cpu-s0")
    code, out, _ = in_process(capsys, monkeypatch, tmp_path, "--method", "window", *run, "--overwrite")
    assert out.splitlines()[-1].endswith(f"; full attention {full['test']:.4f} (runs/full-duplicates-cpu-s0)")


def test_a_short_run_scales_its_warm_up_and_final_evaluation_unless_they_are_given():
    """The README's first run, --steps 200 of ListOps' 1500: 20 warm-up steps of 150, 9 final batches of 63."""
    from bench.config import Preset, RunConfig

    preset = Preset(seq_len=200, steps=1500, warmup=150, final_eval_batches=63)

    def resolved(**given):
        cfg = RunConfig.of(preset, given, method="sbm", task="listops")
        return cfg.warmup, cfg.final_eval_batches

    assert resolved(steps=200) == (20, 9) and resolved(steps=1) == (1, 1)
    assert resolved(steps=200, warmup=150, final_eval_batches=63) == (150, 63)
    # a command that sets any of them keeps the preset's others: the published records' commands
    assert resolved(steps=200, warmup=5) == (5, 63) and resolved(steps=200, final_eval_batches=4) == (150, 4)
    assert resolved(steps=200, eval_batches=2) == (150, 63)
    for steps in (0, 1500, 3000, None):  # evaluating the untrained model, the preset's length, a longer run
        assert resolved(steps=steps) == (150, 63)


@pytest.mark.parametrize(
    "sizes, cores, threads",
    [
        ([], 16, 1),
        (["--seq-len", "2048", "--batch-size", "128"], 16, 16),
        (["--seq-len", "2048", "--batch-size", "128"], 4, 4),
    ],
)
def test_a_run_not_told_omp_num_threads_takes_threads_for_its_size(monkeypatch, tmp_path, sizes, cores, threads):
    """The README's first run takes one thread, ListOps at the paper's sizes one per core; OMP_NUM_THREADS is kept."""
    from bench import cli

    args = harness.build_parser().parse_args(
        ["--task", "listops", "--seq-len", "100", "--steps", "200", *sizes, "--out", str(tmp_path / "run")]
    )
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(cores)
    cli.run_config(args, "full")
    assert torch.get_num_threads() == threads
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    torch.set_num_threads(3)
    cli.run_config(args, "full")
    assert torch.get_num_threads() == 3


ENTRY_POINTS = [
    ("python -m bench.train", "bench.train", []),
    ("python -m bench.train", "bench.train", ["--method", "sbm"]),
    ("python sbm_transformer.py", "sbm_transformer", []),
    ("python ssa.py", "ssa", []),
    ("python kernel_sparse.py", "kernel_sparse", []),
]


@pytest.mark.parametrize("prog, module, argv", ENTRY_POINTS)
def test_help_runs_nothing_says_how_to_call_and_shows_the_presets_values(
    prog, module, argv, tmp_path, monkeypatch, capsys
):
    """--help exits 0 writing nothing; its usage line is the command a user types; no "(default: None)":
    a preset override's value is in the task × preset tables."""
    import importlib

    from bench.tasks import TASKS, get_task

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(module).main([*argv, "--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0 and list(tmp_path.iterdir()) == []
    assert text.startswith(f"usage: {prog} ") and "(default: None)" not in text
    for name in TASKS if module != "kernel_sparse" else ["wikitext2"]:  # the one task the kernel method runs
        for preset, values in get_task(name).presets.items():
            assert any(line.split()[:3] == [name, preset, str(values.seq_len)] for line in text.splitlines())
            assert any(line.split()[:3] == [name, preset, str(values.steps)] for line in text.splitlines())
    assert (module == "kernel_sparse") != any(line.split()[:1] == ["listops"] for line in text.splitlines())


@pytest.mark.parametrize(
    "module, settings", [("sbm_transformer", "SBMConfig"), ("ssa", "SSAConfig"), ("kernel_sparse", "KernelConfig")]
)
def test_a_methods_options_are_its_settings_dataclass(module, settings):
    """Every field of the method's settings is one flag whose default is the field's (written once); parsed with
    no flag given, the settings are the dataclass's defaults."""
    import dataclasses
    import importlib

    from bench import cli

    cls = getattr(importlib.import_module(module), settings)
    p = cli.run_parser("python x.py", "")
    cli.add_settings(p, cls, "options")
    flags = [flag for _, flag, _, _ in cli.settings_flags(cls)]
    assert len(flags) == len(dataclasses.fields(cls)) and set(flags) <= set(p._option_string_actions)
    assert cli.settings_of(p.parse_args(["--task", "duplicates"]), cls) == cls()


def test_sbm_s_official_flag_gives_the_official_choices_unless_a_field_is_given():
    """SBM's --official, a plain flag its main applies: the official code's choices, each field still settable."""
    from bench import cli
    from sbm_transformer import SBMConfig

    argv = ["--task", "duplicates", "--official"]
    cfg, sbm = cli.parse(argv, "sbm", "python x.py", "", SBMConfig, flags={"official": ""})
    assert cfg.flags == {"official": True} and sbm == SBMConfig()
    assert cfg.with_settings(**vars(SBMConfig.official())).settings == SBMConfig.official()
    cfg, _ = cli.parse([*argv, "--path", "fast"], "sbm", "python x.py", "", SBMConfig, flags={"official": ""})
    assert cfg.with_settings(**vars(SBMConfig.official())).settings == SBMConfig.official(path="fast")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "imagenet"], "invalid choice"),
        (["--task", "duplicates", "--method", "transformer-xl"], "invalid choice"),
        (["--task", "duplicates", "--steps", "-1"], "non-negative"),
        (["--task", "duplicates", "--bogus"], "unrecognized arguments"),
        (["--task", "duplicates", "--attn", "features"], "key=value"),
        (["--task", "duplicates", "--lr-floor", "1.5"], "fraction in [0, 1]"),
        (["--task", "duplicates", "--lr-decay", "step"], "invalid choice"),
    ],
)
def test_bad_options_exit_2_with_argparse_messages(args, message, capsys, monkeypatch, tmp_path):
    code, _, err = in_process(capsys, monkeypatch, tmp_path, *args)
    assert code == 2 and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--task", "duplicates", "--attn", "features=4"], 2, "takes no option"),
        (["--task", "bytes", "--seq-len", "64", "--eval-context", "64"], 2, "eval_context"),
        (["--task", "bytes"], 1, "error: bytes: no WikiText-2 text in"),
        (["--task", "wikitext2"], 1, "error: wikitext2: no WikiText-2 text in"),  # its own name, not the bytes task's
        (["--task", "enwik8", "--no-download"], 1, "http://mattmahoney.net/dc/enwik8.zip"),
        (["--task", "duplicates", "--resume"], 1, "no checkpoint"),
    ],
)
def test_bad_input_gives_one_clear_message(tmp_path, capsys, monkeypatch, args, code, message):
    exit_, _, err = in_process(
        capsys,
        monkeypatch,
        tmp_path,
        *args,
        *TINY[2:],
        "--steps",
        "1",
        "--data-dir",
        str(tmp_path / "empty"),
        "--out",
        str(tmp_path / "out"),
    )
    assert exit_ == code, err
    assert message in err and "Traceback" not in err


def test_corrupt_enwik8_exits_with_the_expected_checksum(tmp_path, capsys, monkeypatch):
    (tmp_path / "enwik8").mkdir()
    (tmp_path / "enwik8" / "enwik8").write_bytes(b"not enwik8")
    code, _, err = in_process(capsys, monkeypatch, tmp_path, "--task", "enwik8", "--data-dir", str(tmp_path))
    assert code == 1
    assert "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8" in err
    assert "Traceback" not in err


def test_a_diverged_run_stops_at_its_first_non_finite_loss_and_says_so(tmp_path, capsys, monkeypatch):
    """--lr 1e20: the loss of step 2 is NaN. The run stops there with one line and exit 3, and its record is valid
    JSON saying "diverged", which the grid keeps as a failed cell rather than a result."""
    out = tmp_path / "run"
    code, _, stderr = in_process(
        capsys, monkeypatch, tmp_path, "--task", "duplicates", *TINY, "--steps", "6", "--lr", "1e20", "--out", str(out)
    )
    assert code == 3 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("error: the run diverged: the loss of step 2 is not finite")
    rec = json.loads((out / "metrics.json").read_text())  # json.loads reads a bare NaN: the text is checked
    assert (
        rec["status"] == "diverged" and rec["diverged_at_step"] == 2 and "NaN" not in (out / "metrics.json").read_text()
    )


def test_two_runs_in_one_folder_are_refused_naming_the_holder(tmp_path, capsys, monkeypatch):
    """A run folder holds one run: a second process on the same --out (--overwrite or --resume alike) is refused
    in one line while the first trains, and the first run's log is not interleaved with another's."""
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "bench.train", "--task", "duplicates", *TINY, "--steps", "100000", "--out", str(out)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while not (out / "run.lock").exists() or not (out / "run.lock").read_text().strip():
            assert first.poll() is None and time.time() < deadline, "the first run did not start"
            time.sleep(0.05)
        code, _, err = in_process(
            capsys,
            monkeypatch,
            tmp_path,
            "--task",
            "duplicates",
            *TINY,
            "--seed",
            "1",
            "--steps",
            "2",
            "--out",
            str(out),
            "--overwrite",
        )
        assert code == 2 and "Traceback" not in err
        holder = f"error: another run is running in {out} (pid {first.pid})"
        assert err.strip().splitlines()[-1].startswith(holder)
    finally:
        first.kill()
        first.wait()


def test_a_run_starts_with_a_line_saying_what_where_and_how_long(tmp_path, capsys):
    """The first output: method, task, preset, steps, batch, length, parameters, device, folder; a warm-up not shorter
    than the run is said there too. log.jsonl lines carry the time and the learning rate; the record the whole
    run's wall time beside the training steps'."""
    out = tmp_path / "run"
    capsys.readouterr()
    train_here(
        "--task",
        "duplicates",
        *TINY[:-2],
        "--warmup",
        "10",
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--log-every",
        "2",
        "--out",
        str(out),
    )
    stdout = capsys.readouterr().out
    first = stdout.splitlines()[0]
    assert first.startswith("full on duplicates (cpu preset, seed 0): 4 steps of batch 4 at length 16, ")
    assert f"run folder {out}" in first and "its 10 warm-up steps are not fewer than its 4 steps" in first
    assert "final evaluation: valid and test" in stdout and "measuring FLOPs and memory" in stdout
    assert stdout.splitlines()[-1].startswith("compare: base rate ") and "full attention" not in stdout
    assert not (out / "run.lock").exists()  # a finished folder keeps no lock file
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert all("time" in line and "lr" in line for line in lines)
    rec = record(out)
    assert rec["wall_time_s"] > rec["train_time_s"] > 0
