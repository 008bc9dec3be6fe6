"""Run Megatron-LM's own ``pretrain_gpt.py``, unchanged, under ``torchrun -m ascend_patch``.

The Megatron-LM snapshots (:data:`RELEASES`: ``megatron-lm-core_v0.16.1.tar.gz`` holds ``pretrain_gpt.py``,
``gpt_builders.py``, ``model_provider.py``, ``megatron/{training,legacy,rl,post_training}`` and pairs with
the installed megatron-core 0.16.1 wheel; every other one carries its own ``megatron/core``, which shadows
the wheel) are test inputs kept outside the repository, in ``shared/vendor/`` next to (a parent of) the
checkout, or of the checkout it was cloned from; ``MEGATRON_LM_VENDOR`` names that folder,
``MEGATRON_LM_TARBALL`` another copy of the 0.16.1 one and ``MEGATRON_LM_DIR`` an unpacked Megatron-LM
checkout to use as is for 0.16.1. The tests' conftest unpacks each one once per session into a temporary
directory (fixtures ``megatron_lm`` and ``megatron_release``: Megatron-LM compiles its dataset helpers
inside its own tree); :meth:`MegatronLM.run` then launches::

    python -m torch.distributed.run --standalone --nproc-per-node N -m ascend_patch pretrain_gpt.py ARGS

with the Megatron-LM directory first on ``PYTHONPATH`` and this repository after it, in a working
directory of the test's own (checkpoints, logs), on the cpu target, with a timeout that kills the
whole process group. The interpreter is the test's own unless the release needs another
(:attr:`Release.python`: Megatron-LM main needs 3.12, from the environment ``py312_env.py`` builds); the
launch has that interpreter's folder first on ``PATH`` and a ``python3`` / ``python3-config`` that answer
for it (:func:`python_tools`), which is what Megatron-LM's dataset-helper Makefile runs. Every
iteration's numbers come from ``ASCEND_PATCH_TRAINING_LOG`` (the product's full-precision log of
Megatron's ``training_log``), and the printed log lines are parsed too, so a test can check the two agree.

For checkpoints made by ``ascend-patch convert``: :func:`cli` runs the command line,
:func:`tiny_hf_model` makes and saves a small random transformers model, :func:`periodic_data`
writes a data set whose every training window is known, and :func:`run_converted` does the whole
convert -> ``ascend-patch args`` -> finetune launch and returns transformers' logits on that window
(:func:`padded_cross_entropy` is the loss Megatron-LM reports for them).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import REPO, child_env

__all__ = ["ConvertedRun", "Launch", "MegatronLM", "MegatronRun", "MegatronRunFailed", "RELEASES", "Release", "TINY_GPT",
           "cli", "find_tarball", "find_vendor", "first_error", "padded_cross_entropy", "periodic_data", "python_tools",
           "run_converted", "run_side_by_side", "tiny_hf_model", "unpack", "wait_all"]


@dataclass(frozen=True)
class Release:
    """A vendored Megatron-LM snapshot (shared/vendor/README.md says where each comes from)."""

    name: str  # what tests call it: the megatron-core version its package_info says, or "main"
    tarball: str
    tag: str  # the Megatron-LM git tag (or branch) of the snapshot
    commit: str  # its commit, as the vendor README gives it
    date: str  # the commit's date
    python: tuple[int, int] = (3, 10)  # the oldest Python its code imports on (main: typing.override)


RELEASES: dict[str, Release] = {r.name: r for r in (
    Release("0.12.1", "megatron-lm-core_v0.12.1.tar.gz", "core_v0.12.1", "a845aa7e12b3", "2025-05-20"),
    Release("0.13.1", "megatron-lm-core_v0.13.1.tar.gz", "core_v0.13.1", "ea651a3b78b9", "2025-08-11"),
    Release("0.14.0", "megatron-lm-core_v0.14.0.tar.gz", "core_v0.14.0", "23e00ed0963c", "2025-10-08"),
    Release("0.15.3", "megatron-lm-core_v0.15.3.tar.gz", "core_v0.15.3", "309ffca6a405", "2026-02-06"),
    Release("0.16.1", "megatron-lm-core_v0.16.1.tar.gz", "core_v0.16.1", "55ac7082517c", "2026-03-16"),
    Release("0.17.1", "megatron-lm-core_v0.17.1.tar.gz", "core_v0.17.1", "266f1c97dca4", "2026-05-25"),
    Release("main", "megatron-lm-main-d98e8a6.tar.gz", "main", "d98e8a64ddf3", "2026-08-22", python=(3, 12)),
)}
TARBALL_NAME = RELEASES["0.16.1"].tarball  # the one the megatron_lm fixture (and most tests) use

# A tiny GPT on mock data: each iteration takes well under a second on one core. Seeded, fp32,
# Megatron's defaults otherwise (dropout 0.1, tied embeddings, learned absolute positions).
TINY_GPT: tuple[str, ...] = (
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
    "--seq-length", "64", "--max-position-embeddings", "64",
    "--micro-batch-size", "2", "--global-batch-size", "8",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--seed", "1234",
    "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000",
)

# the largest token id the mock data of releases before 0.16 draws is 4094 (MockGPTLowLevelDataset)
MOCK_TOKEN_BOUND = 4096
HIDE_TRITON = Path(__file__).resolve().parent / "hide_triton"  # a sitecustomize.py that makes triton unimportable

_ITERATION = re.compile(r"\] iteration\s+(\d+)/\s*\d+ \|")
_LOSS = re.compile(r"\| lm loss: (\S+) \|")
_NORM = re.compile(r"\| grad norm: (\S+) \|")


class MegatronRunFailed(AssertionError):
    """The launch exited non-zero or timed out; the message ends with the output's tail."""


@dataclass
class MegatronRun:
    """One launch: its per-iteration records (full precision), printed lines and output."""

    args: list[str]
    returncode: int
    output: str
    workdir: Path
    records: list[dict] = field(default_factory=list)  # ASCEND_PATCH_TRAINING_LOG lines, in order
    printed: dict[int, tuple[float, float | None]] = field(default_factory=dict)  # iteration -> (lm loss, grad norm)
    seconds: float = 0.0  # the launch's wall time

    @property
    def iterations(self) -> list[int]:
        return [r["iteration"] for r in self.records]

    @property
    def losses(self) -> list[float]:
        """``lm loss`` per iteration, in the order logged."""
        return [r["losses"]["lm loss"] for r in self.records]

    @property
    def grad_norms(self) -> list[float]:
        return [r["grad_norm"] for r in self.records]

    def record(self, iteration: int) -> dict:
        """The record of ``iteration`` (the last one logged, if a resumed run logged it twice)."""
        found = [r for r in self.records if r["iteration"] == iteration]
        if not found:
            raise KeyError(f"iteration {iteration} was not logged; logged: {self.iterations}")
        return found[-1]


def find_vendor() -> Path:
    """The folder of vendored Megatron-LM snapshots: ``MEGATRON_LM_VENDOR``, else ``shared/vendor`` above this
    checkout, else above the checkout it was cloned from (``git clone /work/wt/x /tmp/x`` still finds it)."""
    named = os.environ.get("MEGATRON_LM_VENDOR")
    if named:
        return Path(named)
    bases = [Path(REPO).resolve()]
    origin = subprocess.run(["git", "-C", REPO, "config", "--get", "remote.origin.url"], capture_output=True,
                            text=True).stdout.strip()
    if origin and os.path.isdir(origin):  # a clone of a local checkout
        bases.append(Path(origin).resolve())
    looked = []
    for base in bases:
        for parent in base.parents:
            candidate = parent / "shared" / "vendor"
            looked.append(str(candidate))
            if (candidate / TARBALL_NAME).is_file():
                return candidate
    raise FileNotFoundError(f"no shared/vendor with the Megatron-LM snapshots (looked at {', '.join(looked)}); set "
                            "MEGATRON_LM_VENDOR to that folder (or MEGATRON_LM_DIR to an unpacked Megatron-LM 0.16.1)")


def find_tarball(release: str = "0.16.1") -> Path:
    """The vendored snapshot of ``release`` (for 0.16.1 ``MEGATRON_LM_TARBALL`` may name another copy)."""
    named = os.environ.get("MEGATRON_LM_TARBALL")
    if named and release == "0.16.1":
        return Path(named)
    if release not in RELEASES:
        raise KeyError(f"unknown Megatron-LM release {release!r}; known: {', '.join(RELEASES)}")
    tarball = find_vendor() / RELEASES[release].tarball
    if not tarball.is_file():
        raise FileNotFoundError(f"{tarball} is missing")
    return tarball


def unpack(tarball: Path, into: Path) -> Path:
    """Unpack ``tarball`` into ``into``; returns the directory holding ``pretrain_gpt.py``."""
    with tarfile.open(tarball) as tar:
        tar.extractall(into, filter="data")
    found = sorted(into.glob("*/pretrain_gpt.py")) or sorted(into.glob("pretrain_gpt.py"))
    if not found:
        raise FileNotFoundError(f"{tarball} holds no pretrain_gpt.py")
    return found[0].parent


def python_tools(python: str, into: Path) -> Path:
    """A folder holding ``python3`` and ``python3-config`` that answer for ``python`` (returned; put it first on PATH).

    Megatron-LM's dataset Makefile builds ``helpers_cpp`` with ``python3 -m pybind11 --includes`` and names
    it with ``python3-config --extension-suffix``, both found on PATH: a venv has no ``python3-config``, and
    the one PATH finds next (a system or pyenv one) may answer for another Python, whose suffix the
    launching interpreter then cannot import.
    """
    into.mkdir(parents=True, exist_ok=True)
    (into / "python3").write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    (into / "python3-config").write_text(f"""#!{python}
\"\"\"python3-config for {python}: the answers Megatron-LM's dataset Makefile asks for.\"\"\"
import sys
import sysconfig

answers = {{
    "--extension-suffix": sysconfig.get_config_var("EXT_SUFFIX"),
    "--includes": " ".join(sorted({{"-I" + sysconfig.get_path("include"), "-I" + sysconfig.get_path("platinclude")}})),
    "--abiflags": sys.abiflags,
    "--prefix": sys.base_prefix,
    "--exec-prefix": sys.base_exec_prefix,
}}
unknown = [arg for arg in sys.argv[1:] if arg not in answers]
if unknown or not sys.argv[1:]:
    sys.exit(f"python3-config (test harness): answers {{', '.join(answers)}}; not {{' '.join(unknown)}}")
print(" ".join(answers[arg] for arg in sys.argv[1:]))
""")
    for name in ("python3", "python3-config"):
        (into / name).chmod(0o755)
    return into


class MegatronLM:
    """A Megatron-LM directory (``pretrain_gpt.py`` and ``megatron/``) to launch runs from.

    ``python`` is the interpreter that runs the launches (default: the test's own); ``tools`` a folder
    :func:`python_tools` made for it (default: none, the test's PATH as it is); ``hide_triton`` launches
    with triton unimportable even where it is installed, as on an Ascend host (``hide_triton/``).
    """

    def __init__(self, root: Path, *, python: str | None = None, tools: Path | None = None, hide_triton: bool = False,
                 name: str | None = None) -> None:
        self.root = Path(root)
        self.script = self.root / "pretrain_gpt.py"
        self.python = python or sys.executable
        self.tools = tools
        self.hide_triton = hide_triton
        self.name = name or self.root.name

    def __repr__(self) -> str:
        return f"MegatronLM({self.name!r}, {str(self.root)!r}, python={self.python!r})"

    def environ(self, **extra: str) -> dict[str, str]:
        """The environment a launch of this Megatron-LM gets (before ``env=`` overrides)."""
        environ = child_env(ASCEND_PATCH_DEVICE="cpu", OMP_NUM_THREADS="1", **extra)
        paths = [str(self.root), REPO]
        if self.hide_triton:
            paths.append(str(HIDE_TRITON))
        environ["PYTHONPATH"] = os.pathsep.join([*paths, environ.get("PYTHONPATH", "")])
        if self.tools is not None:
            environ["PATH"] = os.pathsep.join([str(self.tools), os.path.dirname(self.python), environ.get("PATH", "")])
        environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # what a user who never set it has
        return environ

    def probe(self, code: str, timeout: float = 120) -> str:
        """Run ``python -c CODE`` in a launch's environment (unpatched); its stdout, or an assertion error."""
        done = subprocess.run([self.python, "-c", code], cwd=self.root, env=self.environ(ASCEND_PATCH="0"),
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{self.name}: {done.stderr[-3000:]}"
        return done.stdout

    def build_helpers(self) -> None:
        """Compile the checkout's dataset helpers now, as rank 0 of a launch would (a no-op when built or when
        megatron-core is the wheel): launches run side by side must not build them at the same time, one
        importing the ``.so`` the other is still writing."""
        datasets = self.root / "megatron" / "core" / "datasets"
        if (datasets / "Makefile").is_file():
            done = subprocess.run(["make", "-C", str(datasets)], env=self.environ(), capture_output=True, text=True,
                                  timeout=600)
            assert done.returncode == 0, f"{self.name}: make -C {datasets}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"

    @functools.cached_property
    def detected(self) -> dict[str, Any]:
        """What ascend_patch detects in a launch's process: ``version``, ``kind`` ("wheel" / "checkout"), ``path``,
        ``wheel`` (the installed megatron-core's version) and ``describe``, without importing megatron."""
        return json.loads(self.probe(
            "import dataclasses, json\n"
            "from ascend_patch.adaptors.megatron.detect import find_megatron\n"
            "found = find_megatron()\n"
            "print(json.dumps({**dataclasses.asdict(found), 'describe': found.describe()}))\n"))

    @property
    def version(self) -> str:
        """The megatron-core version a launch imports (its package_info, as ascend_patch reads it)."""
        return self.detected["version"]

    def has(self, fact: str) -> bool:
        """Whether this release has ``fact`` of ``ascend_patch.adaptors.megatron.releases.FACTS``."""
        from ascend_patch.adaptors.megatron.releases import FACTS, in_release_range

        return in_release_range(self.version, FACTS[fact])

    def tiny_gpt(self) -> tuple[str, ...]:
        """:data:`TINY_GPT` with a vocabulary this release's mock data stays inside: before megatron-core took mock
        token ids modulo the vocabulary (fact ``mock_tokens_within_vocab``), they go up to 4094 whatever it is."""
        if self.has("mock_tokens_within_vocab"):
            return TINY_GPT
        args = list(TINY_GPT)
        args[args.index("--vocab-size") + 1] = str(MOCK_TOKEN_BOUND)
        return tuple(args)

    def run(self, args: Sequence[str], workdir: Path, nproc: int = 1, *, env: Mapping[str, str] | None = None,
            timeout: float = 300, check: bool = True) -> MegatronRun:
        """Launch ``pretrain_gpt.py ARGS`` on ``nproc`` processes in ``workdir`` and collect its numbers.

        ``env`` adds or overrides variables (e.g. ``CUDA_DEVICE_MAX_CONNECTIONS``). With ``check``
        (the default) a non-zero exit or a timeout raises :class:`MegatronRunFailed` with the
        output's tail. A second run in the same ``workdir`` (a resume) appends to its records.
        """
        return self.start(args, workdir, nproc, env=env, timeout=timeout, check=check).wait()

    def start(self, args: Sequence[str], workdir: Path, nproc: int = 1, *, env: Mapping[str, str] | None = None,
              timeout: float = 300, check: bool = True) -> Launch:
        """:meth:`run` without waiting: the launch runs while the caller starts others (see :func:`wait_all`)."""
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        log = workdir / "iterations.jsonl"
        environ = self.environ(ASCEND_PATCH_TRAINING_LOG=str(log))
        environ.update(env or {})
        cmd = [self.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "ascend_patch", str(self.script), *args]
        return Launch(cmd, list(args), workdir, environ, timeout, check)


class Launch:
    """A started :meth:`MegatronLM.start` launch; :meth:`wait` gives its :class:`MegatronRun`.

    The output goes to a file in the workdir (not a pipe), so launches running side by side never
    block on a full pipe while the caller waits for another one.
    """

    def __init__(self, cmd: list[str], args: list[str], workdir: Path, environ: dict[str, str], timeout: float,
                 check: bool) -> None:
        self.args, self.workdir, self.check = args, workdir, check
        self.log = workdir / "iterations.jsonl"
        self.first_new = _line_count(self.log)
        self.output_path = workdir / f"output-{len(list(workdir.glob('output-*.log')))}.log"
        self.timeout = timeout
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        with open(self.output_path, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=workdir, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                         text=True, start_new_session=True)

    def kill(self) -> None:
        """End the launch's whole process group (torchrun and its workers), if it still runs."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait(self) -> MegatronRun:
        """Wait for the launch (until its timeout, counted from its start) and collect its numbers."""
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise MegatronRunFailed(f"pretrain_gpt.py did not finish in {self.timeout:.0f} s: "
                                    f"{' '.join(self.args)}\n{_tail(self.output_path.read_text())}") from None
        output = self.output_path.read_text()
        if self.check and self.proc.returncode != 0:
            raise MegatronRunFailed(f"pretrain_gpt.py exited {self.proc.returncode}: {' '.join(self.args)}\n"
                                    f"first error: {first_error(output)}\n{_tail(output)}")
        records = _read_records(self.log)[self.first_new:] if self.log.exists() else []
        return MegatronRun(self.args, self.proc.returncode, output, self.workdir, records, _printed(output),
                           time.monotonic() - self.started)


def wait_all(*launches: Launch) -> list[MegatronRun]:
    """The runs of launches started side by side, in order; if one fails, the others are ended too.

    On 2 cores a one-process launch leaves a core idle (``OMP_NUM_THREADS=1``): two independent
    one-process launches started together take little more than one.
    """
    try:
        return [launch.wait() for launch in launches]
    finally:
        for launch in launches:
            launch.kill()


def run_side_by_side(starts: Mapping[str, Callable[[], Launch]], after: Mapping[str, str] | None = None,
                     width: int = 2) -> dict[str, MegatronRun | MegatronRunFailed]:
    """Run the launches ``starts`` names (name -> a function that starts it), ``width`` at a time, each one that
    ``after`` maps to another only once that one has succeeded; returns each one's run or the failure it raised
    (a launch whose prerequisite failed is not started: it gets that failure).

    On 2 cores two 2-process launches side by side take less wall time than one after the other (measured
    64-84 s against 107 s for a TE TP2 run with a torch_dist save and an MoE run): much of a launch is
    imports, the torch_dist writer's spawn child and rendezvous, which leave a core idle part of the time.
    """
    after = dict(after or {})
    waiting = list(starts)
    running: dict[str, Launch] = {}
    done: dict[str, MegatronRun | MegatronRunFailed] = {}
    try:
        while waiting or running:
            for name in list(waiting):
                if len(running) >= width:
                    break
                first = after.get(name)
                if first is not None and first not in done:
                    continue
                waiting.remove(name)
                if first is not None and isinstance(done[first], MegatronRunFailed):
                    done[name] = MegatronRunFailed(f"not started: {first} failed")
                    continue
                running[name] = starts[name]()
            finished = [name for name, launch in running.items()
                        if launch.proc.poll() is not None or time.monotonic() > launch.deadline]
            for name in finished:
                try:
                    done[name] = running.pop(name).wait()
                except MegatronRunFailed as failure:
                    done[name] = failure
            if not finished:
                time.sleep(0.2)
    finally:
        for launch in running.values():
            launch.kill()
    return done


def _line_count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _printed(output: str) -> dict[int, tuple[float, float | None]]:
    found = {}
    for line in output.splitlines():
        iteration, loss, norm = _ITERATION.search(line), _LOSS.search(line), _NORM.search(line)
        if iteration and loss:
            found[int(iteration.group(1))] = (float(loss.group(1)), float(norm.group(1)) if norm else None)
    return found


_RANK = re.compile(r"^\[(?:default)?rank\d+\]:\s?")
_ERROR = re.compile(r"^[\w.]*(?:Error|Exception)\b: ")


def first_error(output: str) -> str:
    """The exception line of the first traceback in ``output`` (a worker's, not torchrun's summary), or ''."""
    lines = [_RANK.sub("", line) for line in output.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            for after in lines[i + 1:]:
                if after and not after[0].isspace() and not after.startswith(("Traceback", "During handling",
                                                                                "The above exception")):
                    if "ChildFailedError" not in after:
                        return after.strip()
                    break
    found = [line for line in lines if _ERROR.search(line) and "ChildFailedError" not in line]
    return found[0].strip() if found else ""


def _tail(output: str, lines: int = 60) -> str:
    kept = [line for line in output.splitlines() if "Warning" not in line and not line.startswith("  warn")]
    return "\n".join(kept[-lines:])


# --- checkpoints made by ascend-patch convert --------------------------------------------------------

def cli(*args: str) -> str:
    """``python -m ascend_patch.cli ARGS`` in a child (as a user runs it); its stdout, or an assertion error."""
    done = subprocess.run([sys.executable, "-m", "ascend_patch.cli", *args], env=child_env(ASCEND_PATCH="0"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def tiny_hf_model(config: Any, model_class: Any, path: Path) -> Any:
    """``model_class(config)`` with every weight non-trivial (norms around 1), saved to ``path``; in eval mode."""
    import torch

    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.05 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


def periodic_data(prefix: str, pattern: Any, repeats: int = 16) -> None:
    """One document repeating ``pattern``, as a Megatron indexed data set at ``prefix``: every training window
    of ``len(pattern)`` tokens (whatever Megatron's shuffle picks) is the pattern followed by its first token."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, get_bin_path, get_idx_path

    document = np.tile(pattern, repeats)  # a multiple of the window: the stream stays periodic across epochs
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.int32)
    builder.add_document(document, [len(document)])
    builder.finalize(get_idx_path(prefix))


@dataclass
class ConvertedRun:
    """A finetune launch from a converted checkpoint, with what a test compares it against."""

    run: MegatronRun
    model_args: list[str]  # what ``ascend-patch args`` printed
    logits: Any  # transformers' logits on the training window, [seq, vocab], float64
    labels: Any  # the window's next tokens, [seq]
    work: Path


def run_converted(megatron_lm: MegatronLM, work: Path, model: Any, vocab: int, seq: int, *,
                  convert: Sequence[str], args: Sequence[str] = (), launch: Sequence[str] = (),
                  nproc: int = 1) -> ConvertedRun:
    """Convert ``work/hf`` (``model`` saved there) to ``work/mg`` with ``ascend-patch convert CONVERT``, and
    finetune it for 2 iterations in pretrain_gpt.py with the arguments ``ascend-patch args ARGS`` prints,
    then ``LAUNCH``, on periodic data (``work/periodic``, micro-batch 1, global batch 2, lr 1e-4)."""
    import numpy as np
    import torch

    work = Path(work)
    pattern = np.random.default_rng(1).integers(0, vocab, seq)
    periodic_data(str(work / "periodic"), pattern)
    cli("convert", *convert, "--load-dir", str(work / "hf"), "--save-dir", str(work / "mg"))
    model_args = shlex.split(cli("args", "--hf-config", str(work / "hf"), *args, "--format", "argv"))
    run = megatron_lm.run([
        *model_args, *launch, "--load", str(work / "mg"), "--finetune", "--ckpt-format", "torch",
        "--tokenizer-type", "NullTokenizer", "--data-path", str(work / "periodic"), "--split", "100,0,0",
        "--seq-length", str(seq), "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2",
        "--lr", "1e-4", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000",
    ], work / "run", nproc=nproc)
    window = torch.tensor(np.concatenate([pattern, pattern[:1]]))
    with torch.no_grad():
        logits = model(window[None, :-1]).logits[0].double()
    return ConvertedRun(run, model_args, logits, window[1:], work)


def padded_cross_entropy(logits: Any, labels: Any, padded_vocab: int) -> float:
    """The cross entropy Megatron-LM reports over its padded vocabulary when the padding rows are zero
    (their logits are 0): ``logits`` with ``padded_vocab - vocab`` zero columns appended."""
    import torch

    seq, vocab = logits.shape
    padded = torch.cat([logits, torch.zeros(seq, padded_vocab - vocab, dtype=logits.dtype)], dim=1)
    return torch.nn.functional.cross_entropy(padded, labels).item()


@dataclass
class DistRoundTrip:
    """What the converter and megatron-core make of a torch_dist checkpoint Megatron-LM saved."""

    exported: str  # `convert` mg -> hf output (--verify)
    rewritten: str  # `convert` mg -> torch_dist output (--verify)
    megatron_logits: Any  # megatron-core's logits from Megatron-LM's save (its own loader, TP1 PP1 EP1)
    our_logits: Any  # and from our re-write of it


def export_and_rewrite(work: Path, saved: str, pattern: Any) -> DistRoundTrip:
    """Convert Megatron-LM's torch_dist save ``work/<saved>`` to HF (``work/exported``) and re-write it as torch_dist
    (``work/ours``), then let megatron-core load both (tests/loaders/dist_logits_worker.py) and run ``pattern``."""
    import torch

    from helpers import free_port

    exported = cli("convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir",
                   str(work / saved), "--save-dir", str(work / "exported"), "--verify")
    rewritten = cli("convert", "--load-model-type", "mg", "--save-model-type", "mg", "--ckpt-format", "torch_dist",
                    "--load-dir", str(work / saved), "--save-dir", str(work / "ours"), "--verify")
    torch.save({"input_ids": torch.tensor(pattern)[None]}, work / "tokens.pt")
    iteration = (work / saved / "latest_checkpointed_iteration.txt").read_text().strip()
    worker = os.path.join(REPO, "tests", "loaders", "dist_logits_worker.py")
    folder = f"iter_{int(iteration):07d}"
    done = subprocess.run([sys.executable, worker, str(work / "hf"), str(work / "tokens.pt"), str(work / "logits.pt"),
                           str(work / saved / folder), str(work / "ours" / folder)],
                          env=child_env(ASCEND_PATCH="0", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port())),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    megatron_logits, our_logits = torch.load(work / "logits.pt", weights_only=True)
    return DistRoundTrip(exported, rewritten, megatron_logits, our_logits)
