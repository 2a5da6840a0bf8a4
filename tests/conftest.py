"""Shared test settings: where the real data live (SPARSE_ATTN_DATA, as CI sets it; else ./data, as the harness), one
intra-op thread per test, seeded generators, the device of the on_device tests (SPARSE_ATTN_TEST_DEVICE, cpu unless
set: a GPU job runs ``SPARSE_ATTN_TEST_DEVICE=cuda python -m pytest -m on_device``), a command line's main() run in
this process (``here``), and a recorder of low-precision softmax / exp under autocast."""

import importlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SPARSE_ATTN_DATA", ROOT / "data")).resolve()


def device_from_env():
    """(SPARSE_ATTN_TEST_DEVICE as a torch.device, cpu unless set; or None and why it is not a device here)."""
    text = os.environ.get("SPARSE_ATTN_TEST_DEVICE", "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        return None, f"SPARSE_ATTN_TEST_DEVICE={text!r} is not a torch device (e.g. cpu, cuda, cuda:1)"
    if device.type not in ("cpu", "cuda"):
        return None, f"SPARSE_ATTN_TEST_DEVICE={text!r}: only cpu and cuda devices are tested"
    if device.type == "cuda" and not torch.cuda.is_available():
        return None, f"SPARSE_ATTN_TEST_DEVICE={text!r} but this torch sees no CUDA device"
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        return None, f"SPARSE_ATTN_TEST_DEVICE={text!r} but this machine has {torch.cuda.device_count()} CUDA devices"
    if device.type == "cuda" and device.index is None:  # tensors say cuda:0, and torch.device("cuda") != that
        device = torch.device("cuda", torch.cuda.current_device())
    return device, None


DEVICE, DEVICE_ERROR = device_from_env()
if DEVICE is not None and DEVICE.type == "cpu":  # SBM's tile path: its Triton kernels in triton's interpreter, which
    os.environ.setdefault("TRITON_INTERPRET", "1")  # triton reads once, when the first kernel is defined


def pytest_configure(config):
    if DEVICE_ERROR:  # one line from pytest ("ERROR: ..."), before anything is collected
        raise pytest.UsageError(DEVICE_ERROR)


@pytest.fixture
def device() -> torch.device:
    """The device of the on_device tests (DEVICE)."""
    return DEVICE


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny shapes gain nothing from intra-op threads, and lose much when other jobs share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def default_device():
    """DEVICE as torch's default device, for an on_device test written for the CPU: the tensors, modules and
    generators (``seeded``) its own code makes land there (tests/test_devices.py checks separately that the
    method files pass device= themselves)."""
    with DEVICE:
        yield


def seeded(seed: int, device=None) -> torch.Generator:
    """A generator on ``device`` (default: torch's default device, DEVICE in an on_device test)."""
    return torch.Generator(device or torch.get_default_device()).manual_seed(seed)


def exit_code(main, argv: list):
    """An entry point's ``main(argv)`` run in this process: its exit code, returned or raised
    (argparse's and one_line_errors' SystemExit)."""
    try:
        return main(list(argv))
    except SystemExit as exc:
        return exc.code


@pytest.fixture
def here(capsys, monkeypatch):
    """``python -m MODULE ARGS`` for a test that does not check the process boundary: MODULE's
    main(args) in this process, from the repository root, with one OpenMP thread and no
    SPARSE_ATTN_DATA (as the tests' subprocesses run); a CompletedProcess of its exit code and
    output, as subprocess.run gives."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("SPARSE_ATTN_DATA", raising=False)

    def call(module: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = exit_code(importlib.import_module(module).main, args)
        out, err = capsys.readouterr()
        if isinstance(code, str):  # sys.exit("message"): a process prints it and exits 1
            code, err = 1, err + code + "\n"
        result = subprocess.CompletedProcess([module, *args], code or 0, out, err)
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result

    return call


def processes(*words: str, without: str = "") -> list:
    """Ids of the processes whose command line holds every one of ``words`` (and not ``without``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if all(w in cmdline for w in words) and not (without and without in cmdline):
            found.append(int(pid))
    return found


class LowPrecisionMath(TorchDispatchMode):
    """Records softmax / exp / feature-map ops that run on a bf16 or float16 input (INTERFACE.md: float32)."""

    WATCHED = {
        "softmax",
        "log_softmax",
        "safe_softmax",
        "exp",
        "expm1",
        "logsumexp",
        "logcumsumexp",
        "elu",
        "sigmoid",
        "scaled_dot_product_attention_math",
    }

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0].strip("_")  # aten::_softmax, aten::exp_ → softmax, exp
        low = [a for a in args if isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16)]
        if name in self.WATCHED and low:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


def valid_steps(log_path: Path) -> list:
    """Steps of a run's periodic evaluations in its log.jsonl (the log also holds training-window lines)."""
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    return [line["step"] for line in lines if line["split"] == "valid"]
