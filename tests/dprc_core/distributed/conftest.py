"""The torchrun launches of the multi-process tests, shared: one ``torchrun`` of
ddp_scenarios.py for every data-parallel scenario (2 ranks), and one of fsdp_scenarios.py a world
size (2 and 3 ranks) for every sharded scenario that world runs, each once a session. A rank's
start (torch, and for FSDP transformers, imported; the gloo group formed) costs seconds, and the
scenarios are independent programs (each builds its model and data from its own seeds), so
running them in turn in the same ranks changes nothing they compute. Each launch has a timeout,
so a rank that waits on a collective the other skipped fails the tests instead of hanging them;
a failed launch fails every test that reads it, with the ranks' output."""

from __future__ import annotations

import os
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


def ddp_torchrun(names: tuple[str, ...], out: Path, nproc: int = 2, timeout: float = 180) -> None:
    cmd = _command("ddp_scenarios.py", names, out, nproc)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def fsdp_torchrun(names: tuple[str, ...], out: Path, nproc: int, timeout: float = 400) -> None:
    cmd = _command("fsdp_scenarios.py", names, out, nproc)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    if proc.returncode != 0:  # the lines that say why, without the libraries' warnings
        lines = (proc.stdout + proc.stderr).splitlines()
        keep = [ln for ln in lines if "Warning" not in ln and "warnings.warn" not in ln]
        why = [ln for ln in keep if any(w in ln for w in ("terminate", "what()", "Error"))]
        raise AssertionError("\n".join(why[:40] + ["..."] + keep[-80:]))


def _once(launch: Callable[[], Path]) -> Callable[[], Path]:
    """``launch`` run at the first call; later calls return its folder, or raise its error
    again (a failed launch is not retried by every test that reads it)."""
    result: list = []

    def get() -> Path:
        if not result:
            try:
                result.append(launch())
            except BaseException as exc:  # noqa: BLE001 - raised again to each reader
                result.append(exc)
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    return get


@pytest.fixture(scope="session")
def ddp_out(tmp_path_factory) -> Callable[[], Path]:
    """The folder of the data-parallel launch (every scenario's files), launched at first use."""

    def launch() -> Path:
        out = tmp_path_factory.mktemp("ddp")
        ddp_torchrun(DDP_SCENARIOS, out, timeout=180 * len(DDP_SCENARIOS))
        return out

    return _once(launch)


@pytest.fixture(scope="session")
def fsdp_out(tmp_path_factory) -> Callable[[int], Path]:
    """``fsdp_out(world)``: the folder of that world size's sharded launch, launched at first
    use."""
    launches = {
        world: _once(
            lambda world=world: _fsdp_launch(tmp_path_factory.mktemp(f"fsdp-w{world}"), world)
        )
        for world in FSDP_SCENARIOS
    }
    return lambda world: launches[world]()


def _fsdp_launch(out: Path, world: int) -> Path:
    fsdp_torchrun(FSDP_SCENARIOS[world], out, world, timeout=300 * len(FSDP_SCENARIOS[world]))
    return out
