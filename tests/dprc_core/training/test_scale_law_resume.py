"""A run keeps the hidden-scale law it was planned on (docs/accounting.md §10, "The scale law's
width"): a checkpoint written now resumes on the 1 % law, one written before the law was
recorded (no ``scale_width`` in its plan and ledger) on the legacy 0.1 % law, and a spec that
names another law than its checkpoint's is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dprc_core.accounting import PrivacyLedger, epsilon_for_events
from dprc_core.accounting.events import (
    HIDDEN_SCALE_WIDTH,
    LEGACY_HIDDEN_SCALE_WIDTH,
    SubsampledGaussianEvent,
)
from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training.runner import run_job
from tests.dprc_core.training.test_runner import spec, tiny_dir, train_file  # noqa: F401 (fixtures)

KW = dict(checkpoint_every=3, sketch="per_example")


def _stopped_run(tiny_dir, train_file, out: Path) -> Path:  # noqa: F811
    """A run stopped at its first checkpoint; its folder."""
    run_job(spec(tiny_dir, train_file, out, **KW), should_stop=lambda: True)
    return out


def _state(ckpt: Path) -> dict:
    return json.loads((ckpt / "resume" / "state.json").read_text())


def test_a_checkpoint_written_now_resumes_on_the_1pct_law(tiny_dir, train_file, tmp_path):  # noqa: F811
    part = _stopped_run(tiny_dir, train_file, tmp_path / "part")
    latest = ckpt_io.latest_checkpoint(part)
    assert latest is not None
    assert _state(latest)["plan"]["scale_width"] == HIDDEN_SCALE_WIDTH == 0.01
    resumed = run_job(spec(tiny_dir, train_file, part, **KW))
    assert resumed.status == "succeeded" and resumed.resumed_from == 1
    assert resumed.plan.scale_width == 0.01
    ledger = PrivacyLedger.from_json((Path(resumed.checkpoint) / "ledger.json").read_text())
    assert {e.scale_width for e in ledger.events} == {0.01}
    full = run_job(spec(tiny_dir, train_file, tmp_path / "full", **KW))
    assert full.plan == resumed.plan
    assert resumed.epsilon == full.epsilon <= 4.0


def test_a_checkpoint_without_its_law_resumes_on_the_legacy_law(tiny_dir, train_file, tmp_path):  # noqa: F811
    """The checkpoint's plan and ledger rewritten as the code before the law was recorded wrote
    them (no ``scale_width``): the resume plans on 0.1 %, keeps the checkpoint's σ (calibrated
    on 1 %, so on 0.1 % it meets the target too) and accounts every step on 0.1 %."""
    part = _stopped_run(tiny_dir, train_file, tmp_path / "part")
    latest = ckpt_io.latest_checkpoint(part)
    assert latest is not None
    state = _state(latest)
    sigma = state["plan"]["noise_multiplier"]
    del state["plan"]["scale_width"]
    (latest / "resume" / "state.json").write_text(json.dumps(state, sort_keys=True))
    ledger = json.loads((latest / "ledger.json").read_text())
    for event in ledger["events"]:
        del event["scale_width"]
    (latest / "ledger.json").write_text(json.dumps(ledger, sort_keys=True))
    copy = tmp_path / "copy"
    shutil.copytree(part, copy)

    events: list[str] = []
    resumed = run_job(spec(tiny_dir, train_file, part, **KW), on_event=events.append)
    assert resumed.status == "succeeded" and resumed.resumed_from == 1
    plan = resumed.plan
    assert plan.scale_width == LEGACY_HIDDEN_SCALE_WIDTH == 0.001
    # the noise that ran (the checkpoint's σ; a fresh calibration on 0.1 % may differ)
    assert plan.noise_multiplier == sigma
    out = PrivacyLedger.from_json((Path(resumed.checkpoint) / "ledger.json").read_text())
    assert {e.scale_width for e in out.events} == {0.001}
    # the ε printed is the legacy law's ε of the whole run, computed here from the event's
    # fields, and it meets the target
    legacy = SubsampledGaussianEvent(
        sigma, plan.sample_rate, plan.steps, "hutch", 32, sketch="per_example", scale_width=0.001
    )
    assert resumed.epsilon == pytest.approx(epsilon_for_events([legacy], plan.delta), rel=1e-9)
    assert resumed.epsilon <= 4.0

    # naming the 1 % law for that checkpoint is another plan: refused
    with pytest.raises(ValueError, match="written for another plan"):
        run_job(spec(tiny_dir, train_file, copy, scale_width=0.01, **KW))
