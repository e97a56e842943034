"""The runner in secure mode: noise and batches from the OS-keyed ChaCha20 stream, so a fixed
seed no longer reproduces a run, yet a resumed run equals the uninterrupted one (the keys are
in the private resume state), and a checkpoint is resumed only in the mode that wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dprc_core.training.runner import run_job
from tests.dprc_core.training.test_runner import spec, tiny_dir, train_file  # noqa: F401 (fixtures)


def weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"step-{step:08d}" / "model" / "model.safetensors"))


def test_secure_runs_with_one_seed_differ_and_resume_exactly(tiny_dir, train_file, tmp_path):  # noqa: F811
    a = run_job(spec(tiny_dir, train_file, tmp_path / "a", secure_rng=True, checkpoint_every=3))
    b = run_job(spec(tiny_dir, train_file, tmp_path / "b", secure_rng=True, checkpoint_every=3))
    assert a.status == b.status == "succeeded" and a.epsilon == b.epsilon  # same plan
    wa, wb = Path(a.checkpoint), Path(b.checkpoint)
    ta = load_file(str(wa / "model" / "model.safetensors"))
    tb = load_file(str(wb / "model" / "model.safetensors"))
    assert any(not torch.equal(ta[k], tb[k]) for k in ta)  # the seed no longer fixes the noise
    # stop after the first checkpoint, resume: the same weights as a run never stopped
    part = tmp_path / "part"
    stopped = run_job(
        spec(tiny_dir, train_file, part, secure_rng=True, checkpoint_every=3),
        should_stop=lambda: True,
    )
    assert stopped.status == "stopped"
    resumed = run_job(spec(tiny_dir, train_file, part, secure_rng=True, checkpoint_every=3))
    assert resumed.status == "succeeded" and resumed.resumed_from == stopped.steps_done
    assert resumed.epsilon == a.epsilon
    # a checkpoint is resumed only in the mode that wrote it
    with pytest.raises(ValueError, match="secure_rng"):
        run_job(spec(tiny_dir, train_file, part, secure_rng=False, checkpoint_every=3))


def test_a_secure_resume_replays_the_same_noise_and_batches(tiny_dir, train_file, tmp_path):  # noqa: F811
    import shutil

    part = tmp_path / "p"
    run_job(
        spec(tiny_dir, train_file, part, secure_rng=True, checkpoint_every=3),
        should_stop=lambda: True,
    )
    twin = tmp_path / "twin"
    shutil.copytree(part, twin)
    one = run_job(spec(tiny_dir, train_file, part, secure_rng=True, checkpoint_every=3))
    two = run_job(spec(tiny_dir, train_file, twin, secure_rng=True, checkpoint_every=3))
    w1 = load_file(str(Path(one.checkpoint) / "model" / "model.safetensors"))
    w2 = load_file(str(Path(two.checkpoint) / "model" / "model.safetensors"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)  # bit for bit: the keys were saved
    assert one.losses == two.losses
