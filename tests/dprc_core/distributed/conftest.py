"""The torchrun launches of the multi-process tests, shared: one ``torchrun`` of
ddp_scenarios.py for every data-parallel scenario (2 ranks), and one of fsdp_scenarios.py a world
size (2 and 3 ranks) for every sharded scenario that world runs, each once a session. A rank's
start (torch, and for FSDP transformers, imported; the gloo group formed) costs seconds, and the
scenarios are independent programs (each builds its model and data from its own seeds), so
running them in turn in the same ranks changes nothing they compute. Each launch has a timeout,
so a rank that waits on a collective the other skipped fails the tests instead of hanging them.
A scenario that raises fails the tests that read it, with its ranks' tracebacks, and ends the
launch (the scenarios before it keep their results; the tests of those after it fail, naming
it); a launch that crashes or times out fails every test that reads it, with its output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

# every scenario of ddp_scenarios.py, in one launch (test_ddp.py, test_ddp_units.py)
DDP_SCENARIOS = ("steps", "noise", "dpftrl", "sampler", "units")
# the scenarios of fsdp_scenarios.py each world size runs (test_fsdp.py, test_ddp_units.py); the
# refusals last (a refusal leaves nothing pending, but nothing else runs after it either way)
FSDP_SCENARIOS = {
    2: ("steps", "noise", "memory", "mixed", "units", "refusals"),
    3: ("steps", "noise", "memory"),
}


def _command(script: str, names: tuple[str, ...], out: Path, nproc: int) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", str(HERE / script), ",".join(names), str(out),
    ]  # fmt: skip


class Launch:
    """One torchrun of several scenarios; :meth:`folder` gives a scenario's results, or fails
    with what went wrong for it: its ranks' tracebacks (a scenario that raises is recorded in
    ``<name>-rank<r>.error`` and ends the launch), or the launch's output when it failed
    otherwise (a crash, a timeout: then the whole process group is killed, ranks included)."""

    def __init__(self, script: str, names: tuple[str, ...], out: Path, nproc: int, timeout: float):
        self.out, self.names = out, names
        cmd = _command(script, names, out, nproc)
        with subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
            start_new_session=True,
        ) as proc:  # fmt: skip
            try:
                output, _ = proc.communicate(timeout=timeout)
                self.returncode: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output = f"timed out after {timeout} s\n" + proc.communicate()[0]
                self.returncode = None
        self.output = output

    def folder(self, name: str) -> Path:
        assert name in self.names, (name, self.names)
        errors = sorted(self.out.glob(f"{name}-rank*.error"))
        if errors:
            raise AssertionError("\n".join(f"{e.name}:\n{e.read_text()}" for e in errors))
        if self.returncode == 0:
            return self.out
        failed = {e.name.split("-rank")[0] for e in self.out.glob("*.error")}
        stopped = [n for n in self.names if n in failed]
        if stopped and self.names.index(stopped[0]) < self.names.index(name):
            raise AssertionError(f"the launch ended at scenario {stopped[0]!r} (see its test)")
        if stopped:  # this scenario ran to its end before the failing one
            return self.out
        raise AssertionError(_why(self.output))


def _why(output: str) -> str:
    """The lines that say why a launch failed, without the libraries' warnings."""
    lines = output.splitlines()
    keep = [ln for ln in lines if "Warning" not in ln and "warnings.warn" not in ln]
    why = [ln for ln in keep if any(w in ln for w in ("terminate", "what()", "Error"))]
    return "\n".join(why[:40] + ["..."] + keep[-80:])


@pytest.fixture(scope="session")
def ddp_out(tmp_path_factory) -> Callable[[str], Path]:
    """``ddp_out(name)``: the folder of scenario ``name``'s files, from the one data-parallel
    launch (started at first use)."""
    launches: list[Launch] = []

    def folder(name: str) -> Path:
        if not launches:
            out = tmp_path_factory.mktemp("ddp")
            timeout = 300
            launches.append(Launch("ddp_scenarios.py", DDP_SCENARIOS, out, 2, timeout))
        return launches[0].folder(name)

    return folder


@pytest.fixture(scope="session")
def fsdp_out(tmp_path_factory) -> Callable[[int, str], Path]:
    """``fsdp_out(world, name)``: the folder of scenario ``name``'s files, from world size
    ``world``'s sharded launch (started at first use)."""
    launches: dict[int, Launch] = {}

    def folder(world: int, name: str) -> Path:
        if world not in launches:
            out = tmp_path_factory.mktemp(f"fsdp-w{world}")
            names = FSDP_SCENARIOS[world]
            launches[world] = Launch("fsdp_scenarios.py", names, out, world, 600)
        return launches[world].folder(name)

    return folder
