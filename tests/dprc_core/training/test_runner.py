"""The job runner on a tiny local Llama: Poisson steps, ledger, checkpoints, stop and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dprc_core.accounting import PrivacyLedger, epsilon
from dprc_core.accounting.step_epsilons import LEDGER_TOLERANCE
from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training.runner import JobSpec, run_job
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


def spec(tiny_dir, train_file, out, **kw) -> JobSpec:
    args = dict(
        model=str(tiny_dir),
        task="causal_lm",
        train_file=str(train_file),
        output_dir=str(out),
        epochs=1.5,
        batch_size=8,
        learning_rate=1e-2,
        max_seq_len=16,
        seed=3,
        target_epsilon=4.0,
        max_physical_batch_size=4,
    )
    args.update(kw)
    return JobSpec(**args)


def weights(ckpt: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(ckpt) / "model" / "model.safetensors"))


def test_a_run_follows_its_plan_and_learns(tiny_dir, train_file, tmp_path):
    seen = []
    result = run_job(
        spec(tiny_dir, train_file, tmp_path / "a", checkpoint_every=4), on_progress=seen.append
    )
    plan = result.plan
    assert plan.steps == 9 and plan.sample_rate == pytest.approx(8 / 48)  # ceil(1.5·48/8)
    assert result.status == "succeeded" and result.steps_done == 9
    assert [p.step for p in seen] == list(range(1, 10))
    # ε of the ledger = the accountant's ε for (σ, q, 9 steps) computed independently here
    # (per-example sketches: the default for hutch)
    assert plan.sketch == "per_example"
    want = epsilon(
        plan.noise_multiplier, plan.sample_rate, 9, plan.delta, "hutch", 32, sketch="per_example"
    )
    assert result.epsilon == pytest.approx(want, rel=1e-12) and want <= 4.0
    ledger = PrivacyLedger.from_json((Path(result.checkpoint) / "ledger.json").read_text())
    assert sum(e.steps for e in ledger.events) == 9
    # checkpoints at 4, 8 and the end; ε grows along the chain
    names = [p.name for p in ckpt_io.list_checkpoints(tmp_path / "a")]
    assert names == ["step-000004", "step-000008", "step-000009"]
    eps = [
        json.loads((p / "metadata.json").read_text())["epsilon"]
        for p in ckpt_io.list_checkpoints(tmp_path / "a")
    ]
    assert eps[0] < eps[1] < eps[2] == pytest.approx(result.epsilon)
    # progress shows the ε of the steps that ran: the ledger's at checkpoints and at the end,
    # else the plan's ε curve, equal to it within LEDGER_TOLERANCE (test_live_epsilon.py)
    for p in seen:
        now = epsilon(
            plan.noise_multiplier,
            plan.sample_rate,
            p.step,
            plan.delta,
            "hutch",
            32,
            sketch=plan.sketch,
        )
        assert abs(p.epsilon - now) <= LEDGER_TOLERANCE * now
        if p.checkpoint is not None:
            assert p.epsilon == pytest.approx(now, rel=1e-12)
    # learnable toy task: the loss goes down
    assert sum(result.losses[-3:]) / 3 < sum(result.losses[:3]) / 3 - 0.3


def test_released_files_never_include_the_resume_state(tiny_dir, train_file, tmp_path):
    result = run_job(spec(tiny_dir, train_file, tmp_path / "r", epochs=0.5))
    released = ckpt_io.release_files(result.checkpoint)
    assert released and not any("resume" in p.parts for p in released)
    assert {p.name for p in released} >= {
        "model.safetensors",
        "config.json",
        "ledger.json",
        "tokenizer.json",
        "metadata.json",
    }
    assert not list(Path(result.checkpoint).rglob("*.bin"))  # no pickles anywhere
    assert not list(Path(result.checkpoint).rglob("*.pt"))


def test_stop_then_resume_equals_an_uninterrupted_run(tiny_dir, train_file, tmp_path):
    full = run_job(spec(tiny_dir, train_file, tmp_path / "full", checkpoint_every=3))
    stopped = run_job(
        spec(tiny_dir, train_file, tmp_path / "part", checkpoint_every=3), should_stop=lambda: True
    )
    assert stopped.status == "stopped" and stopped.steps_done == 1
    resumed = run_job(spec(tiny_dir, train_file, tmp_path / "part", checkpoint_every=3))
    assert resumed.resumed_from == 1 and resumed.steps_done == full.steps_done
    a, b = weights(full.checkpoint), weights(resumed.checkpoint)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert resumed.epsilon == full.epsilon == full.plan.planned_epsilon


def test_a_crash_between_checkpoints_replays_and_counts_each_step_once(
    tiny_dir, train_file, tmp_path
):
    class Crash(Exception):
        pass

    def crash_at_5(progress):
        if progress.step == 5:
            raise Crash

    with pytest.raises(Crash):
        run_job(
            spec(tiny_dir, train_file, tmp_path / "c", checkpoint_every=3), on_progress=crash_at_5
        )
    assert [p.name for p in ckpt_io.list_checkpoints(tmp_path / "c")] == ["step-000003"]
    resumed = run_job(spec(tiny_dir, train_file, tmp_path / "c", checkpoint_every=3))
    full = run_job(spec(tiny_dir, train_file, tmp_path / "f", checkpoint_every=3))
    assert resumed.resumed_from == 3
    ledger = PrivacyLedger.from_json((Path(resumed.checkpoint) / "ledger.json").read_text())
    assert sum(e.steps for e in ledger.events) == resumed.plan.steps  # no step counted twice
    a, b = weights(full.checkpoint), weights(resumed.checkpoint)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert resumed.epsilon == full.epsilon


def test_resume_with_another_plan_is_refused(tiny_dir, train_file, tmp_path):
    run_job(
        spec(tiny_dir, train_file, tmp_path / "p", checkpoint_every=2), should_stop=lambda: True
    )
    with pytest.raises(ValueError, match="another plan"):
        run_job(spec(tiny_dir, train_file, tmp_path / "p", target_epsilon=2.0))


def test_training_loss_can_be_withheld(tiny_dir, train_file, tmp_path):
    seen = []
    run_job(
        spec(tiny_dir, train_file, tmp_path / "q", epochs=0.5, report_train_loss=False),
        on_progress=seen.append,
    )
    assert seen and all(p.loss is None and p.clipped_fraction is None for p in seen)


def test_nu_dpftrl_job_accounts_the_matrix_mechanism_and_resumes_exactly(
    tiny_dir, train_file, tmp_path
):
    from dprc_core.accounting import dpftrl_epsilon

    kw = dict(
        noise_mechanism="nu_dpftrl",
        nu=0.1,
        bands=4,
        norm_method="exact",
        epochs=2,
        batch_size=12,
        checkpoint_every=3,
    )
    full = run_job(spec(tiny_dir, train_file, tmp_path / "n", **kw))
    plan = full.plan
    assert plan.steps == 2 * 4 and plan.mechanism == "nu_dpftrl"
    want = dpftrl_epsilon(
        plan.noise_multiplier, plan.delta, 0.1, steps=8, participations=2, min_separation=4, bands=4
    )
    assert full.epsilon == pytest.approx(want, rel=1e-9) and want <= 4.0
    run_job(spec(tiny_dir, train_file, tmp_path / "m", **kw), should_stop=lambda: True)
    resumed = run_job(spec(tiny_dir, train_file, tmp_path / "m", **kw))
    assert resumed.resumed_from == 1
    a, b = weights(full.checkpoint), weights(resumed.checkpoint)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert resumed.epsilon == full.epsilon


def test_nu_dpftrl_with_randomized_clipping_is_refused(tiny_dir, train_file, tmp_path):
    with pytest.raises(ValueError, match="correlated noise"):
        run_job(
            spec(
                tiny_dir,
                train_file,
                tmp_path / "x",
                noise_mechanism="nu_dpftrl",
                nu=0.1,
                norm_method="hutch",
                epochs=1,
                batch_size=12,
            )
        )


def test_dprc_train_says_when_a_resume_keeps_the_checkpoints_sigma(
    tiny_dir, train_file, tmp_path, capsys
):
    from dprc_core.cli import main

    out = tmp_path / "sigma"
    stopped = run_job(
        spec(tiny_dir, train_file, out, noise_multiplier=1.0, checkpoint_every=2),
        should_stop=lambda: True,
    )
    assert stopped.status == "stopped" and stopped.steps_done == 1
    (tmp_path / "job.yaml").write_text(
        f"model: {tiny_dir}\ntask: causal_lm\ntrain_file: {train_file}\noutput_dir: {out}\n"
        "epochs: 1.5\nbatch_size: 8\nlearning_rate: 0.01\nmax_seq_len: 16\nseed: 3\n"
        "noise_multiplier: 1.1\nmax_physical_batch_size: 4\ncheckpoint_every: 2\n"
    )
    assert main(["train", str(tmp_path / "job.yaml"), "--quiet"]) == 0
    said = capsys.readouterr()
    assert json.loads(said.out)["noise_multiplier"] == 1.0  # the checkpoint's σ, kept
    assert (
        "Warning: resuming from the checkpoint at step 1 with its noise multiplier 1, not the "
        "spec's noise multiplier 1.1" in said.err
    )
