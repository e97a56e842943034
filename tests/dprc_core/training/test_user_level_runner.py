"""User-level DP through the runner (issue 31): a spec with ``privacy_unit: user`` reads the
user field, plans over users (N = users, q = expected users / N, δ ≤ 1/N_users), samples users
and clips each user's lines together; its ε is ``epsilon()`` at the user rate and agrees with
Google dp_accounting; it resumes bit for bit; bad specs and files are refused with reasons."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as dpl
from safetensors.torch import load_file

from dprc_core import accounting
from dprc_core.training.data import DataError
from dprc_core.training.runner import JobSpec, run_job
from dprc_core.training.tiny import build_tiny_llama

# 11 users: "heavy" with 40 lines, five with 3, five with 1 (60 lines)
USERS = (
    ["heavy"] * 40 + [f"mid{i}" for i in range(5) for _ in range(3)] + [f"one{i}" for i in range(5)]
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama", hidden=32)


@pytest.fixture(scope="module")
def user_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "users.jsonl"
    order = torch.randperm(len(USERS), generator=torch.Generator().manual_seed(0)).tolist()
    lines = [json.dumps({"text": "ab" * (3 + i % 4) + ".", "patient": USERS[i]}) for i in order]
    path.write_text("\n".join(lines) + "\n")
    return path


def user_spec(tiny_dir, data, out, **kw) -> JobSpec:
    args = dict(
        model=str(tiny_dir),
        task="causal_lm",
        train_file=str(data),
        output_dir=str(out),
        epochs=2,
        batch_size=4,  # expected users a step
        learning_rate=1e-2,
        max_seq_len=16,
        seed=5,
        target_epsilon=4.0,
        max_physical_batch_size=8,
        norm_method="exact",
        privacy_unit="user",
        user_field="patient",
        max_examples_per_user=4,
    )
    args.update(kw)
    return JobSpec(**args)


def _dp_accounting_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    pld = dpl.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=1e-4, pessimistic_estimate=True
    )
    return pld.self_compose(steps).get_epsilon_for_delta(delta)


def test_a_user_level_run_is_planned_and_accounted_per_user(tiny_dir, user_file, tmp_path):
    seen = []
    result = run_job(user_spec(tiny_dir, user_file, tmp_path / "run"), on_progress=seen.append)
    plan = result.plan
    assert result.status == "succeeded"
    assert plan.unit == "user" and plan.dataset_size == 11
    assert plan.sample_rate == pytest.approx(4 / 11)
    assert plan.steps == math.ceil(2 * 11 / 4)
    assert plan.delta <= 1 / 11
    # the units of a step are users: at most 11 of them, whatever the 60 lines
    assert all(p.batch_size <= 11 for p in seen) and any(p.batch_size > 0 for p in seen)
    # ε: the subsampled Gaussian at the users' rate, as dp_accounting computes it
    ours = accounting.epsilon(plan.noise_multiplier, plan.sample_rate, plan.steps, plan.delta)
    assert result.epsilon == pytest.approx(ours, rel=1e-9)
    ref = _dp_accounting_epsilon(plan.noise_multiplier, plan.sample_rate, plan.steps, plan.delta)
    assert -0.005 <= ours / ref - 1 <= 0.01, (ours, ref)
    assert result.epsilon <= 4.0


def test_a_user_level_run_resumes_bit_for_bit(tiny_dir, user_file, tmp_path):
    part = tmp_path / "part"
    stopped = run_job(user_spec(tiny_dir, user_file, part), should_stop=lambda: True)
    assert stopped.status == "stopped" and stopped.steps_done == 1
    resumed = run_job(user_spec(tiny_dir, user_file, part))
    full = run_job(user_spec(tiny_dir, user_file, tmp_path / "full"))
    assert resumed.resumed_from == 1 and resumed.status == "succeeded"
    a = load_file(str(Path(resumed.checkpoint) / "model" / "model.safetensors"))
    b = load_file(str(Path(full.checkpoint) / "model" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert resumed.epsilon == full.epsilon


def test_secure_mode_runs_user_level_and_resumes(tiny_dir, user_file, tmp_path):
    out = tmp_path / "secure"
    stopped = run_job(
        user_spec(tiny_dir, user_file, out, secure_rng=True), should_stop=lambda: True
    )
    assert stopped.status == "stopped" and stopped.steps_done == 1
    resumed = run_job(user_spec(tiny_dir, user_file, out, secure_rng=True))
    assert resumed.resumed_from == 1 and resumed.status == "succeeded"
    assert resumed.steps_done == resumed.plan.steps
    ours = accounting.epsilon(
        resumed.plan.noise_multiplier,
        resumed.plan.sample_rate,
        resumed.plan.steps,
        resumed.plan.delta,
    )
    assert resumed.epsilon == pytest.approx(ours, rel=1e-9) and resumed.epsilon <= 4.0


def test_a_line_without_its_user_is_refused(tiny_dir, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(
        json.dumps({"text": "abab.", "patient": "p1"}) + "\n" + json.dumps({"text": "ab."}) + "\n"
    )
    with pytest.raises(DataError, match="line 2: needs the user field 'patient'"):
        run_job(user_spec(tiny_dir, data, tmp_path / "out"))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(privacy_unit="person"), "privacy_unit must be one of"),
        (dict(max_examples_per_user=0), "max_examples_per_user must be a positive integer"),
        (dict(max_examples_per_user=9), "larger than max_physical_batch_size"),
        (dict(noise_mechanism="nu_dpftrl", nu=0.1), "gaussian noise mechanism"),
        (dict(privacy_unit="example"), "applies to privacy_unit: user"),
    ],
)
def test_bad_specs_are_refused(tiny_dir, user_file, tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        user_spec(tiny_dir, user_file, tmp_path / "out", **change)


def test_the_default_lines_per_user(tiny_dir, user_file, tmp_path):
    spec = user_spec(tiny_dir, user_file, tmp_path / "out", max_examples_per_user=None)
    assert spec.examples_per_user == 8  # min(8, max_physical_batch_size = 8)
    small = user_spec(
        tiny_dir, user_file, tmp_path / "o", max_examples_per_user=None, max_physical_batch_size=4
    )
    assert small.examples_per_user == 4


def _rewrite_sigma(out: Path, factor: float) -> float:
    """Make the last checkpoint look written by an accountant that calibrated another σ."""
    state_file = sorted((out / "checkpoints").iterdir())[-1] / "resume" / "state.json"
    state = json.loads(state_file.read_text())
    state["plan"]["noise_multiplier"] *= factor
    state_file.write_text(json.dumps(state))
    return state["plan"]["noise_multiplier"]


def test_a_checkpoint_from_another_accountant_resumes_with_its_own_sigma(
    tiny_dir, user_file, tmp_path
):
    out = tmp_path / "upgrade"
    stopped = run_job(user_spec(tiny_dir, user_file, out), should_stop=lambda: True)
    assert stopped.status == "stopped"
    sigma = _rewrite_sigma(out, 1 + 1e-9)  # a newer accountant's calibration, in the last digits
    resumed = run_job(user_spec(tiny_dir, user_file, out))
    assert resumed.status == "succeeded" and resumed.plan.noise_multiplier == sigma
    own = accounting.epsilon(
        sigma, resumed.plan.sample_rate, resumed.plan.steps, resumed.plan.delta
    )
    assert resumed.epsilon == pytest.approx(own, rel=1e-9) and resumed.epsilon <= 4.0
    # a σ whose ε no longer meets the target is not kept: refused, not run
    again = tmp_path / "too-small"
    run_job(user_spec(tiny_dir, user_file, again), should_stop=lambda: True)
    _rewrite_sigma(again, 0.5)
    with pytest.raises(ValueError, match="written for another plan"):
        run_job(user_spec(tiny_dir, user_file, again))
    # another data set size, batch or clipping is another plan, whatever the σ
    with pytest.raises(ValueError, match="written for another plan"):
        run_job(user_spec(tiny_dir, user_file, out, batch_size=5))
