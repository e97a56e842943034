"""The runner with per-example sketches: planned and accounted with the hidden-scale model (a
smaller σ than shared sketches for the same ε), the ledger says so, a seeded run is
reproducible (projections keyed by the data set index), and a secure run resumes bit for bit
(its projection key is in the private resume state)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dprc_core.accounting import PrivacyLedger, noise_multiplier
from dprc_core.training.runner import JobSpec, run_job
from tests.dprc_core.training.test_runner import spec, tiny_dir, train_file  # noqa: F401 (fixtures)


def weights(ckpt: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(ckpt) / "model" / "model.safetensors"))


def test_per_example_plan_ledger_and_reproducibility(tiny_dir, train_file, tmp_path):  # noqa: F811
    a = run_job(spec(tiny_dir, train_file, tmp_path / "a", sketch="per_example"))
    shared = run_job(spec(tiny_dir, train_file, tmp_path / "s", sketch="shared"))
    default = run_job(spec(tiny_dir, train_file, tmp_path / "d"))  # no sketch asked for
    assert default.plan.sketch == "per_example"
    assert all(
        torch.equal(x, y)
        for x, y in zip(
            weights(a.checkpoint).values(), weights(default.checkpoint).values(), strict=True
        )
    )
    assert a.status == shared.status == "succeeded"
    meta = json.loads((Path(a.checkpoint) / "metadata.json").read_text())
    assert meta["sketch"] == "per_example" and meta["clipping"] == "hutch"
    ledger = PrivacyLedger.from_json((Path(a.checkpoint) / "ledger.json").read_text())
    assert {e.sketch for e in ledger.events} == {"per_example"}
    plan = json.loads((Path(a.checkpoint) / "resume" / "state.json").read_text())["plan"]
    # σ is the library's calibration in the hidden-scale model, below the shared one
    want = noise_multiplier(
        4.0, plan["delta"], plan["sample_rate"], plan["steps"], "hutch", 32, sketch="per_example"
    )
    assert plan["noise_multiplier"] == want
    shared_plan = json.loads((Path(shared.checkpoint) / "resume" / "state.json").read_text())
    assert plan["noise_multiplier"] < shared_plan["plan"]["noise_multiplier"]
    assert a.epsilon <= 4.0
    # a seeded run is reproducible, and its sketches are not the shared ones
    again = run_job(spec(tiny_dir, train_file, tmp_path / "b", sketch="per_example"))
    wa, wb, ws = weights(a.checkpoint), weights(again.checkpoint), weights(shared.checkpoint)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], ws[k]) for k in wa)


def test_a_secure_per_example_run_resumes_bit_for_bit(tiny_dir, train_file, tmp_path):  # noqa: F811
    part = tmp_path / "p"
    kw = dict(secure_rng=True, checkpoint_every=3, sketch="per_example")
    run_job(spec(tiny_dir, train_file, part, **kw), should_stop=lambda: True)
    twin = tmp_path / "twin"
    shutil.copytree(part, twin)
    one = run_job(spec(tiny_dir, train_file, part, **kw))
    two = run_job(spec(tiny_dir, train_file, twin, **kw))
    w1, w2 = weights(one.checkpoint), weights(two.checkpoint)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert one.losses == two.losses


def test_per_example_needs_a_randomized_method(tiny_dir, train_file, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="randomized norm method"):
        JobSpec(
            **{
                **vars(spec(tiny_dir, train_file, tmp_path)),
                "norm_method": "exact",
                "sketch": "per_example",
            }
        )
