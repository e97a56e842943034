"""Checkpoints resume bit for bit whatever wrote them: the resume state holds the engine's and
the sampler's state dicts whole; a checkpoint in the flattened layout (``rng.safetensors`` with
``engine:``/``noise:``/``projections:``/``sampler:`` keys) still resumes, and so does one
written by the library of the last release before the resume state changed layout (commit
:data:`FLAT_LAYOUT_COMMIT`, taken from this repository's history with ``git archive``), run in a
subprocess with that code (for the Poisson-sampled modes, whose batches after the checkpoint are
drawn differently since, the restored state is compared instead: :data:`SAMPLING_CHANGED`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dprc_core.accounting.events import LEGACY_HIDDEN_SCALE_WIDTH
from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training.runner import JobSpec, run_job, start_run
from tests.dprc_core.training.test_runner import spec, tiny_dir, train_file  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[3]
# the last commit whose runner wrote the flattened resume layout
FLAT_LAYOUT_COMMIT = "b64bbfac0e8fc07a2be06ac92f0e256847425822"

MODES = {
    "gaussian": dict(checkpoint_every=3),
    "nu_dpftrl": dict(
        noise_mechanism="nu_dpftrl",
        nu=0.1,
        bands=4,
        norm_method="exact",
        epochs=2,
        batch_size=12,
        checkpoint_every=3,
    ),
    "secure": dict(secure_rng=True, checkpoint_every=3, sketch="per_example"),
}
# JobSpec fields that commit's code does not know (left out at their defaults)
FIELDS_SINCE = {"privacy_unit", "user_field", "max_examples_per_user", "sharding", "method"}
# modes whose draws after the checkpoint changed on purpose since that commit: the torch
# generator's Poisson coins became float64 against floor(q·2^53)/2^53 (commit 7fdcdd6; float32
# coins ran an inclusion probability above q), then both Poisson samplers, torch's and the
# secure one, draw by geometric skips (the same law in O(batch): docs/accounting.md §12).
# Their resume restores the same state, but the batches it then draws from it are not that
# commit's, so its resumed weights cannot match.
SAMPLING_CHANGED = {"gaussian", "secure"}

# run with that commit's code: stop after the first checkpoint, copy the run folder to
# a twin, and resume the twin to the end with that same code
WRITE_WITH_OLD_CODE = """
import json, shutil, sys
from dprc_core.training.runner import JobSpec, run_job
for job in json.loads(sys.argv[1]):
    run_job(JobSpec(**job["spec"]), should_stop=lambda: True)
    shutil.copytree(job["spec"]["output_dir"], job["twin"])
    run_job(JobSpec(**{**job["spec"], "output_dir": job["twin"]}))
"""


def weights(ckpt: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(ckpt) / "model" / "model.safetensors"))


def assert_same_weights(a: str | Path, b: str | Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=0)


def _without_noise(job: JobSpec) -> dict:
    fields = dict(vars(job))
    del fields["noise"]
    return fields


@pytest.fixture(scope="module")
def flat_layout_runs(tiny_dir, train_file, tmp_path_factory) -> dict[str, dict[str, Path]]:  # noqa: F811
    old = tmp_path_factory.mktemp("flat-layout-code")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", FLAT_LAYOUT_COMMIT, "dprc_core"],
        capture_output=True,
    )
    if archive.returncode != 0:  # a source tree without the history (an sdist): nothing to run
        pytest.skip(f"commit {FLAT_LAYOUT_COMMIT[:7]} is not in this checkout's history")
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    root = tmp_path_factory.mktemp("main-runs")
    runs = {m: {"part": root / m / "part", "twin": root / m / "twin"} for m in MODES}
    jobs = [
        # the noise object is said by the flat fields too (the older code reads those)
        {"spec": _without_noise(spec(tiny_dir, train_file, runs[m]["part"], **kw)), "twin": str(t)}
        for m, kw in MODES.items()
        for t in [runs[m]["twin"]]
    ]
    # JSON: the spec's fields as given (lora is None here), less the fields added since that
    # commit, at their defaults
    defaults = {f.name: f.default for f in dataclasses.fields(JobSpec)}
    for job in jobs:
        job["spec"] = {
            k: v
            for k, v in job["spec"].items()
            if v is not None and not (k in FIELDS_SINCE and v == defaults[k])
        }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [sys.executable, "-c", WRITE_WITH_OLD_CODE, json.dumps(jobs)],
        cwd=old,  # that commit's library, not this one's
        env=env,
        check=True,
        timeout=1200,
    )
    return runs


@pytest.mark.parametrize("mode", list(MODES))
def test_a_checkpoint_written_by_the_previous_layout_resumes_bit_for_bit(
    mode,
    flat_layout_runs,
    tiny_dir,  # noqa: F811
    train_file,  # noqa: F811
):
    part, twin = flat_layout_runs[mode]["part"], flat_layout_runs[mode]["twin"]
    if mode in SAMPLING_CHANGED:
        _assert_restores_the_checkpointed_state(spec(tiny_dir, train_file, part, **MODES[mode]))
        copy = part.parent / "copy"
        shutil.copytree(part, copy)
    resumed = run_job(spec(tiny_dir, train_file, part, **MODES[mode]))
    assert resumed.status == "succeeded" and resumed.resumed_from == 1
    twin_end = ckpt_io.latest_checkpoint(twin)
    assert resumed.checkpoint is not None and twin_end is not None
    assert Path(resumed.checkpoint).name == twin_end.name  # the same steps
    if mode in SAMPLING_CHANGED:  # the same run again from the same old checkpoint
        again = run_job(spec(tiny_dir, train_file, copy, **MODES[mode]))
        assert_same_weights(resumed.checkpoint, again.checkpoint)
        assert again.epsilon == resumed.epsilon
    else:  # the same weights as that commit's own resume of the same checkpoint
        assert_same_weights(resumed.checkpoint, twin_end)
    # that commit planned per-example sketches on the hidden-scale law of its time (0.1 %,
    # not recorded in its plan): the resume keeps that law, and its ε meets the target on it
    hidden = resumed.plan.sketch == "per_example"
    assert resumed.plan.scale_width == (LEGACY_HIDDEN_SCALE_WIDTH if hidden else None)
    assert resumed.epsilon <= 4.0
    if mode == "secure":  # keys from the OS: no uninterrupted twin to compare with
        return
    # the uninterrupted run of the same plan: on the same law (a fresh run asks for it; left
    # unset, it would plan on today's 1 % law, a slightly different ε)
    law = {"scale_width": resumed.plan.scale_width} if hidden else {}
    full = run_job(spec(tiny_dir, train_file, part.parent / "full", **MODES[mode], **law))
    assert full.plan.scale_width == resumed.plan.scale_width
    assert resumed.epsilon == full.epsilon
    if mode not in SAMPLING_CHANGED:  # (its first step drew that commit's batch)
        assert_same_weights(resumed.checkpoint, full.checkpoint)


def _assert_restores_the_checkpointed_state(job) -> None:
    """The run started from the old checkpoint holds that checkpoint's weights, optimizer,
    engine (generators, noise) and sampler state exactly as the old code wrote them."""
    latest = ckpt_io.latest_checkpoint(job.output_dir)
    assert latest is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        saved = ckpt_io.read_resume(latest)
    run = start_run(job)
    try:
        assert run.resumed_from == saved.steps_done == 1
        _assert_same_state(run.sampler.state_dict(), saved.sampler)
        _assert_same_state(run.engine.state_dict(), saved.engine)
        _assert_same_state(run.optimizer.state_dict()["state"], saved.optimizer["state"])
        on_disk = weights(latest)
        for name, value in run.model.state_dict().items():
            if name in on_disk:
                torch.testing.assert_close(value, on_disk[name], rtol=0, atol=0)
    finally:
        run.engine.detach()


def _assert_same_state(a, b) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (a, b)
        for k in a:
            _assert_same_state(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_state(x, y)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    else:
        assert a == b, (a, b)


def _flatten_resume(ckpt: Path) -> None:
    """Rewrite ``ckpt``'s resume state in the flattened layout."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        state, _, rng, _ = ckpt_io.load_resume(ckpt)
    resume = ckpt / "resume"
    meta = json.loads((resume / "state.json").read_text())["optimizer"]
    (resume / "state.safetensors").unlink()
    save_file({k: v.contiguous() for k, v in rng.items()}, str(resume / "rng.safetensors"))
    (resume / "state.json").write_text(json.dumps({**state, "optimizer": meta}, sort_keys=True))


@pytest.mark.parametrize("mode", ["gaussian", "secure"])
def test_a_checkpoint_in_the_flattened_layout_resumes_bit_for_bit(
    mode,
    tiny_dir,  # noqa: F811
    train_file,  # noqa: F811
    tmp_path,
):
    part = tmp_path / "part"
    stopped = run_job(spec(tiny_dir, train_file, part, **MODES[mode]), should_stop=lambda: True)
    resume = Path(stopped.checkpoint) / "resume"
    state = json.loads((resume / "state.json").read_text())
    assert state["format"] == ckpt_io.RESUME_FORMAT
    assert "seed" in state["engine"] and "generators" in state["engine"]  # the engine's, whole
    tensors = load_file(str(resume / "state.safetensors"))
    if mode == "secure":  # the keys are tensors in the private state, never in JSON
        assert {"engine/noise/key", "engine/projections/key", "sampler/key"} <= set(tensors)
    twin = tmp_path / "twin"
    shutil.copytree(part, twin)
    _flatten_resume(Path(stopped.checkpoint))
    flat = run_job(spec(tiny_dir, train_file, part, **MODES[mode]))
    whole = run_job(spec(tiny_dir, train_file, twin, **MODES[mode]))
    assert flat.resumed_from == whole.resumed_from == 1
    assert_same_weights(flat.checkpoint, whole.checkpoint)
    assert flat.losses == whole.losses
