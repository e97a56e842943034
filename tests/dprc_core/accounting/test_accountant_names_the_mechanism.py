"""``dprc accountant epsilon`` not told which mechanism a job ran lists ε under each one it
could have run, so a user checking a job finds the job's own number (issue 33, point 2): the
engine's own event (default norms: hutch, per-example sketches) is one of the rows."""

from __future__ import annotations

import json

import pytest
import torch

from dprc_core.accounting import PrivacyLedger
from dprc_core.cli import main
from dprc_core.clipping import Clipping, Hutch
from dprc_core.engine import PrivacyEngine
from dprc_core.noise import Gaussian

SIGMA, Q, STEPS, DELTA = 0.9, 0.1067, 10, 1e-5
JOB = ["--sigma", str(SIGMA), "-q", str(Q), "--steps", str(STEPS), "--delta", str(DELTA)]


def _run(capsys, *extra: str) -> dict:
    assert main(["accountant", "epsilon", *JOB, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_engines_own_epsilon_is_listed_when_the_mechanism_is_not_named(capsys):
    model = torch.nn.Linear(4, 2)
    engine = PrivacyEngine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        clipping=Clipping(1.0, Hutch()),  # the default norm method of DPTrainer and dprc train
        noise=Gaussian(SIGMA),
        expected_batch_size=8,
    )
    ledger = PrivacyLedger()
    ledger.record(engine.privacy_event(STEPS, Q))
    engine.detach()
    the_jobs = ledger.epsilon(DELTA)

    out = _run(capsys)
    rows = out["by_mechanism"]
    assert [(r["envelope"], r["sketch"]) for r in rows] == [
        ("exact", "shared"),
        ("hutch", "per_example"),
        ("hutch", "shared"),
        ("hutchpp", "per_example"),
        ("hutchpp", "shared"),
    ]
    assert out["epsilon"] == rows[0]["epsilon"]  # the headline stays exact norms
    engine_row = rows[1]
    assert engine_row["default_sketch"] and engine_row["k"] == 32
    assert engine_row["epsilon"] == pytest.approx(the_jobs, rel=1e-9)
    # what each mechanism costs orders as the accountant says: exact < per-example < shared
    assert rows[0]["epsilon"] < rows[1]["epsilon"] < rows[2]["epsilon"]

    # named fully: that mechanism's ε alone, no table
    named = _run(capsys, "--envelope", "hutch", "--k", "32", "--sketch", "per_example")
    assert "by_mechanism" not in named
    assert named["epsilon"] == pytest.approx(the_jobs, rel=1e-9)
    assert "by_mechanism" not in _run(capsys, "--envelope", "exact")
    # a randomized envelope without --sketch: the shared bound, and the table again
    partly = _run(capsys, "--envelope", "hutch", "--k", "32")
    assert partly["epsilon"] == rows[2]["epsilon"] and "by_mechanism" in partly


def test_the_text_output_prints_the_table(capsys):
    assert main(["accountant", "epsilon", *JOB]) == 0
    text = capsys.readouterr().out
    assert text.startswith("epsilon = ")
    assert "hutch k=32, per-example sketch (default sketch)" in text
    assert "under each mechanism a job could" in text
