"""Per-rank programs for tests/dprc_core/distributed/test_ddp.py, run under ``torchrun`` (gloo,
CPU).

``python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_scenarios.py NAMES OUT``
(``NAMES``: one scenario or several, comma-separated, run in turn in the same ranks: the tests
start torchrun once, since the start of a rank costs seconds). Each rank writes its results to
``OUT/<name>-rank<r>.safetensors`` (tensors) or ``.json``.
The models and batches are built from fixed seeds, so the test process builds the very same
ones for its single-process reference (:func:`build_case`).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from dprc_core.clipping import Clipping, Exact, Hutch
from dprc_core.distributed import current_ranks, shard_indices
from dprc_core.engine import PrivacyEngine
from dprc_core.noise import Gaussian, NuDPFTRL
from dprc_core.training.sampling import FixedOrderSampler, PoissonSampler

N_EXAMPLES = 12
DIM, CLASSES, SEQ = 6, 3, 5
# logical batches (example indices): a mixed one, one all on rank 0 (rank 1's part empty)
BATCHES = [[0, 1, 2, 3, 5, 8, 9], [0, 2, 4, 6, 10]]
METHODS = ("exact", "hutch", "hutch/per_example")


class TinyNet(nn.Module):
    """An embedding, a layer norm and two linear layers over a short sequence (float64)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.hidden = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.hidden(self.norm(self.emb(ids))))
        return self.out(h).mean(1)


def build_case() -> tuple[TinyNet, dict[str, torch.Tensor]]:
    torch.manual_seed(1234)
    model = TinyNet().double()
    data = {
        "ids": torch.randint(0, 20, (N_EXAMPLES, SEQ)),
        "y": torch.randint(0, CLASSES, (N_EXAMPLES,)),
    }
    return model, data


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["ids"]), batch["y"], reduction="none")


def make_engine(
    model: nn.Module, method: str, sigma: float, seed: int = 7, nu: float | None = None
) -> PrivacyEngine:
    """``method``: ``"exact"``, ``"hutch"`` (k = 4, shared sketches) or ``"hutch/per_example"``
    for per-example sketches; Gaussian noise, or ν-DP-FTRL noise with damping ``nu``."""
    method, _, sketch = method.partition("/")
    norm = Exact() if method == "exact" else Hutch(4, sketch=sketch or "shared")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    return PrivacyEngine(
        model,
        opt,
        clipping=Clipping(0.3, norm, check_independence=True),
        noise=Gaussian(sigma) if nu is None else NuDPFTRL(sigma, nu=nu),
        expected_batch_size=4.0,
        seed=seed,
    )


def run_steps(
    engine: PrivacyEngine,
    data: dict[str, torch.Tensor],
    batches: list[list[int]],
    micro: int | None,
    part=lambda idx: idx,
) -> list[dict]:
    """One engine step per logical batch (this process's ``part`` of it, in micro-batches)."""
    stats = []
    for indices in batches:
        idx = part(torch.tensor(indices, dtype=torch.long))
        for chunk in idx.split(micro or max(len(idx), 1)) if len(idx) else []:
            batch = {k: v[chunk] for k, v in data.items()}
            engine.accumulate(loss_fn, batch, example_ids=chunk)  # keys of per-example sketches
        s = engine.step()
        stats.append({"batch_size": s.batch_size, "mean_loss": s.mean_loss})
    return stats


def scenario_steps(out: Path) -> None:
    """σ = 0 steps of exact, hutch and hutch with per-example sketches, with and without
    micro-batches."""
    ranks = current_ranks()
    for method in METHODS:
        for micro in (None, 2):
            model, data = build_case()
            engine = make_engine(model, method, sigma=0.0)
            stats = run_steps(engine, data, BATCHES, micro, lambda i: shard_indices(i, ranks))
            tag = f"steps-{method.replace('/', '-')}-{micro}"
            tensors = {n: p.detach().contiguous() for n, p in model.named_parameters()}
            save_file(tensors, str(out / f"{tag}-rank{ranks.rank}.safetensors"))
            (out / f"{tag}-rank{ranks.rank}.json").write_text(json.dumps(stats))


def scenario_dpftrl(out: Path) -> None:
    """σ > 0 ν-DP-FTRL steps over fixed-order batches: the correlated state is rank 0's."""
    ranks = current_ranks()
    model, data = build_case()
    engine = make_engine(model, "exact", sigma=0.8, nu=0.3)
    batches = [b.tolist() for b in FixedOrderSampler(N_EXAMPLES, 4, steps=5, seed=2)]
    run_steps(engine, data, batches, 2, lambda i: shard_indices(i, ranks))
    tensors = {n: p.detach().contiguous() for n, p in model.named_parameters()}
    save_file(tensors, str(out / f"dpftrl-rank{ranks.rank}.safetensors"))


def scenario_noise(out: Path) -> None:
    """One σ > 0 step of a wide linear layer from zero weights with an empty batch: the update
    is the noise alone (−lr · noise / (qN))."""
    ranks = current_ranks()
    torch.manual_seed(0)
    model = nn.Linear(400, 250, bias=False).double()
    with torch.no_grad():
        model.weight.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    engine = PrivacyEngine(
        model,
        opt,
        clipping=Clipping(2.0, Hutch()),
        noise=Gaussian(1.5),
        expected_batch_size=3.0,
        seed=11,
    )
    engine.step()
    save_file({"w": model.weight.detach()}, str(out / f"noise-rank{ranks.rank}.safetensors"))


def scenario_sampler(out: Path) -> None:
    """Each rank's parts of Poisson (explicit and rank-0 seeds) and fixed-order batches."""
    ranks = current_ranks()
    explicit = [t.tolist() for t in PoissonSampler(50, 0.1, 40, seed=5, ranks=ranks)]
    fresh = PoissonSampler(50, 0.1, 5, ranks=ranks)
    fixed = [t.tolist() for t in FixedOrderSampler(23, 5, steps=9, seed=3, ranks=ranks)]
    (out / f"sampler-rank{ranks.rank}.json").write_text(
        json.dumps(
            {
                "explicit": explicit,
                "fresh_seed": fresh.generator.initial_seed(),
                "fixed": fixed,
            }
        )
    )


def scenario_units(out: Path) -> None:
    """A tiny linear model's user-level steps (per-example sketches: the engine tracks the
    example ids too): users on one rank each (steps), user 5 on both ranks (refused on both,
    no step), example id 5 on both ranks (refused), the ranks disagreeing on the unit
    (refused), then users on one rank each again (steps)."""
    ranks = current_ranks()
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    engine = PrivacyEngine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        clipping=Clipping(1.0, Hutch(4, sketch="per_example")),
        noise=Gaussian(1.0),
        expected_batch_size=4.0,
        seed=3,
    )
    x, y = torch.randn(3, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)

    def loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return (m(batch[0]).squeeze(-1) - batch[1]) ** 2

    def refused(**ids: list[int]) -> str:
        before = model.weight.detach().clone()
        try:
            engine.step(loss, (x, y), **ids)
        except ValueError as exc:
            assert torch.equal(model.weight.detach(), before), "a refused batch stepped"
            return str(exc)
        return "stepped"

    r = ranks.rank
    result: dict = {}
    result["disjoint"] = engine.step(loss, (x, y), user_ids=[2 * r + 1, 2 * r + 1, 2 * r + 2])
    result["disjoint"] = result["disjoint"].batch_size
    result["users"] = refused(user_ids=[5, 5, 2 * r + 1])
    result["examples"] = refused(example_ids=[5, 10 + r, 20 + r])
    result["units"] = refused(**({"user_ids": [1, 2, 2]} if r == 0 else {"example_ids": [7, 8, 9]}))
    result["again"] = engine.step(loss, (x, y), user_ids=[2 * r + 1, 2 * r + 2, 2 * r + 2])
    result["again"] = result["again"].batch_size
    result["steps"] = engine.steps
    (out / f"units-rank{r}.json").write_text(json.dumps(result))


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    torch.distributed.init_process_group(backend="gloo")
    scenarios = {
        "steps": scenario_steps,
        "noise": scenario_noise,
        "sampler": scenario_sampler,
        "dpftrl": scenario_dpftrl,
        "units": scenario_units,
    }
    try:
        for one in name.split(","):
            try:
                scenarios[one](out)
            except BaseException:  # recorded for its test; the launch ends here (the other
                # ranks may wait in a collective: torchrun stops them when this one exits)
                rank = torch.distributed.get_rank()
                (out / f"{one}-rank{rank}.error").write_text(traceback.format_exc())
                sys.stderr.write(traceback.format_exc())
                sys.stderr.flush()
                os._exit(1)
            torch.distributed.barrier()  # the next scenario starts on every rank together
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
