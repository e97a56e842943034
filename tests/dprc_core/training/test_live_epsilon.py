"""The live ε of a running job (issue 45.6) is the ε of the steps that ran, at every step: the
progress of small runs on a tiny Llama against independent recomputations — Google
dp_accounting for exact-norm DP-SGD, the project's ledger at exactly t steps for randomized
clipping, user-level DP, ν-DP-FTRL and resumed runs. Never a bound for steps that have not run:
ε at step 5 is not ε at step 10."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl

from dprc_core.accounting import NuDPFTRLEvent, PrivacyLedger, SubsampledGaussianEvent
from dprc_core.accounting.step_epsilons import LEDGER_TOLERANCE
from dprc_core.training.runner import JobSpec, Progress, run_job
from dprc_core.training.tiny import build_tiny_llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama", hidden=32)


@pytest.fixture(scope="module")
def train_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    lines = [json.dumps({"text": "ab" * (3 + i % 4) + "."}) for i in range(48)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def user_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "users.jsonl"
    lines = [json.dumps({"text": "ab" * (3 + i % 4) + ".", "who": f"u{i % 12}"}) for i in range(48)]
    path.write_text("\n".join(lines) + "\n")
    return path


def spec(tiny_dir, data, out, **kw) -> JobSpec:
    args = dict(
        model=str(tiny_dir),
        task="causal_lm",
        train_file=str(data),
        output_dir=str(out),
        epochs=2,
        batch_size=8,
        learning_rate=1e-2,
        max_seq_len=16,
        seed=3,
        target_epsilon=4.0,
        max_physical_batch_size=4,
    )
    args.update(kw)
    return JobSpec(**args)


def _gaussian_event(plan, steps: int) -> SubsampledGaussianEvent:
    return SubsampledGaussianEvent(
        plan.noise_multiplier, plan.sample_rate, steps, plan.clipping, plan.k, sketch=plan.sketch
    )


def _check_ledger(seen: list[Progress], plan, event_of) -> None:
    """Each step's ε is the ledger's at exactly that many steps (within the curve's
    tolerance; identical at checkpoints), and it never decreases."""
    for p in seen:
        want = PrivacyLedger([event_of(plan, p.step)]).epsilon(plan.delta)
        assert abs(p.epsilon - want) <= LEDGER_TOLERANCE * want, (p.step, p.epsilon, want)
        if p.checkpoint is not None:
            assert p.epsilon == want
    values = [p.epsilon for p in seen]
    assert values == sorted(values)


def test_exact_norms_report_dp_accountings_epsilon_at_every_step(tiny_dir, train_file, tmp_path):
    seen: list[Progress] = []
    result = run_job(
        spec(tiny_dir, train_file, tmp_path / "e", norm_method="exact"), on_progress=seen.append
    )
    plan = result.plan
    assert [p.step for p in seen] == list(range(1, plan.steps + 1)) and plan.steps == 12
    for p in seen:
        ref = dpl.from_gaussian_mechanism(
            plan.noise_multiplier,
            sampling_prob=plan.sample_rate,
            value_discretization_interval=1e-4,
            pessimistic_estimate=True,
        )
        if p.step > 1:
            ref = ref.self_compose(p.step)
        want = ref.get_epsilon_for_delta(plan.delta)
        assert -0.005 <= p.epsilon / want - 1.0 <= 0.01, (p.step, p.epsilon, want)
    _check_ledger(seen, plan, _gaussian_event)
    assert seen[-1].epsilon == result.epsilon


def test_randomized_clipping_reports_the_ledger_at_every_step(tiny_dir, train_file, tmp_path):
    seen: list[Progress] = []
    result = run_job(
        spec(tiny_dir, train_file, tmp_path / "h", checkpoint_every=7), on_progress=seen.append
    )
    plan = result.plan
    assert plan.clipping == "hutch" and plan.sketch == "per_example" and plan.steps == 12
    _check_ledger(seen, plan, _gaussian_event)
    # what the demo showed: the same ε at steps 5 and 10 (a bound for step 10 at step 5)
    at = {p.step: p.epsilon for p in seen}
    assert at[5] < at[10]
    assert at[5] < PrivacyLedger([_gaussian_event(plan, 6)]).epsilon(plan.delta)


def test_user_level_reports_the_ledger_at_every_step(tiny_dir, user_file, tmp_path):
    seen: list[Progress] = []
    result = run_job(
        spec(
            tiny_dir,
            user_file,
            tmp_path / "u",
            batch_size=3,
            learning_rate=0.1,
            norm_method="exact",
            privacy_unit="user",
            user_field="who",
            max_examples_per_user=4,
        ),
        on_progress=seen.append,
    )
    plan = result.plan
    assert plan.unit == "user" and plan.dataset_size == 12 and plan.steps == 8
    _check_ledger(seen, plan, _gaussian_event)


def test_nu_dpftrl_reports_the_chains_first_steps(tiny_dir, train_file, tmp_path):
    seen: list[Progress] = []
    kw = dict(noise_mechanism="nu_dpftrl", nu=0.1, bands=4, norm_method="exact", batch_size=12)
    result = run_job(spec(tiny_dir, train_file, tmp_path / "f", **kw), on_progress=seen.append)
    plan = result.plan
    assert plan.steps == 8 and plan.mechanism == "nu_dpftrl"
    for p in seen:
        event = NuDPFTRLEvent.prefix(plan.noise_multiplier, p.step, 0.1, 4, 4)
        want = PrivacyLedger([event]).epsilon(plan.delta)
        assert p.epsilon == pytest.approx(want, rel=1e-9)


def test_a_resumed_run_reports_the_ledgers_epsilon(tiny_dir, train_file, tmp_path):
    full: list[Progress] = []
    run_job(spec(tiny_dir, train_file, tmp_path / "full"), on_progress=full.append)
    out = tmp_path / "part"
    stopped = run_job(spec(tiny_dir, train_file, out), should_stop=lambda: True)
    assert stopped.steps_done == 1
    seen: list[Progress] = []
    resumed = run_job(spec(tiny_dir, train_file, out), on_progress=seen.append)
    assert resumed.resumed_from == 1 and [p.step for p in seen] == list(range(2, 13))
    plan = resumed.plan
    for p in seen:
        # the ledger of the released chain: the checkpoint's events and the segment since
        ledger = PrivacyLedger([_gaussian_event(plan, 1), _gaussian_event(plan, p.step - 1)])
        want = ledger.epsilon(plan.delta)
        assert abs(p.epsilon - want) <= LEDGER_TOLERANCE * want, (p.step, p.epsilon, want)
    # a resume as planned is the plan's curve: the uninterrupted run's values
    assert [p.epsilon for p in seen] == [p.epsilon for p in full[1:]]
    assert resumed.epsilon == seen[-1].epsilon


def test_a_departure_is_reaccounted_with_the_checkpoints_events(tiny_dir, train_file, tmp_path):
    """A checkpoint whose ledger is not the plan's first steps (here: one more event, as
    another accountant might have written) is composed with the segment."""
    from dprc_core.training import checkpoint as ckpt_io

    out = tmp_path / "dep"
    run_job(spec(tiny_dir, train_file, out), should_stop=lambda: True)
    latest = ckpt_io.latest_checkpoint(out)
    assert latest is not None
    from dprc_core.training.runner import start_run

    run = start_run(spec(tiny_dir, train_file, out))
    extra = SubsampledGaussianEvent(3.0, 0.05, 2)
    run.prior = [*run.prior, extra]
    plan = run.plan
    for done in (2, 5, 12):
        run.done = done
        want = PrivacyLedger([*run.prior, _gaussian_event(plan, done - 1)]).epsilon(plan.delta)
        ours = run.live_epsilon()
        assert abs(ours - want) <= LEDGER_TOLERANCE * want, (done, ours, want)
    assert run.live_epsilon(exact=True) == run.ledger_at(12).epsilon(plan.delta)
    run.engine.detach()
