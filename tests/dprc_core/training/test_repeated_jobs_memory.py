"""A long-lived process (the embedded worker, a Celery worker, a benchmark loop) runs many jobs:
nothing of a finished job may stay alive.

The per-sample hooks put tensor hooks on the autograd graph. A hook that held the pass strongly
made a cycle through C++ autograd nodes, which Python's garbage collector cannot traverse, so
every model a process ever trained stayed in memory (about 250 MB per 6-step MiniLM job). These
tests hold each job's model by a weak reference and require it to be gone once the job is done.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

import dprc_core.training.runner as runner
from dprc_core import Clipping, Exact, Gaussian, Hutch, HutchPP, PrivacyEngine
from dprc_core.clipping import NormChoice
from dprc_core.training.runner import run_job
from tests.dprc_core.training.test_runner import spec, tiny_dir, train_file  # noqa: F401 (fixtures)


def _per_sample_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    x, y = batch[:, :-1], batch[:, -1].long()
    return nn.functional.cross_entropy(model(x), y, reduction="none")


def _one_engine_run(clipped_sum: str, norm: NormChoice) -> weakref.ref:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = PrivacyEngine(
        model,
        opt,
        clipping=Clipping(1.0, norm, clipped_sum=clipped_sum),
        noise=Gaussian(1.0),
        expected_batch_size=4,
        seed=1,
    )
    batch = torch.cat([torch.randn(4, 6), torch.randint(0, 3, (4, 1)).float()], dim=1)
    for _ in range(2):
        engine.step(_per_sample_loss, batch)
    ref = weakref.ref(model)
    engine.close()
    return ref


@pytest.mark.parametrize(
    ("clipped_sum", "norm"),
    [
        ("bookkeeping", Exact()),
        ("two_pass", Exact()),
        ("bookkeeping", Hutch(4, sketch="shared")),
        ("two_pass", HutchPP(4, sketch="per_example")),
        ("bookkeeping", Hutch(4, sketch="per_example")),
    ],
    ids=[
        "bookkeeping-exact-shared",
        "two_pass-exact-shared",
        "bookkeeping-hutch-shared",
        "two_pass-hutchpp-per_example",
        "bookkeeping-hutch-per_example",
    ],
)
def test_a_closed_engine_frees_its_model(clipped_sum, norm):
    ref = _one_engine_run(clipped_sum, norm)
    gc.collect()
    assert ref() is None, "the model of a closed engine is still reachable"


@pytest.mark.parametrize(
    "kw",
    [
        dict(norm_method="hutch"),
        dict(norm_method="exact"),
        dict(norm_method="hutchpp", sketch="per_example", secure_rng=True),
    ],
    ids=["hutch", "exact", "hutchpp-per-example-secure"],
)
def test_repeated_jobs_in_one_process_keep_no_model(
    tiny_dir,  # noqa: F811
    train_file,  # noqa: F811
    tmp_path,
    monkeypatch,
    kw,
):
    loaded: list[weakref.ref] = []
    load = runner.load_model

    def tracking_load(*args, **kwargs):
        model = load(*args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(runner, "load_model", tracking_load)
    for i in range(3):
        result = run_job(spec(tiny_dir, train_file, tmp_path / f"job{i}", **kw), resume=False)
        assert result.status == "succeeded"
        del result
        gc.collect()
        alive = [r() is not None for r in loaded]
        assert len(alive) == i + 1 and not any(alive), f"models still alive after job {i}: {alive}"
