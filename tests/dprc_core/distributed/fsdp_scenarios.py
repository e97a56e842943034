"""Per-rank programs for tests/dprc_core/distributed/test_fsdp.py: FSDP2-sharded models
(``fully_shard`` on every block and the root) under ``torchrun`` (gloo, CPU, float64).

``python -m torch.distributed.run --standalone --nproc-per-node W fsdp_scenarios.py NAMES OUT``
(``NAMES``: one scenario or several, comma-separated, run in turn in the same ranks: the tests
start one torchrun a world size, since the start of a rank — torch and transformers imported —
costs seconds). Each rank writes ``OUT/<name>-rank<r>.safetensors`` / ``.json``: the whole
parameters after the steps (gathered with ``get_model_state_dict(full_state_dict=True)``), and
what the test checks. Models and batches come from fixed seeds, so the test process builds the
same ones for its single-process reference.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from dprc_core import PrivacyWarning, sharding
from dprc_core.clipping import Clipping, Exact, Hutch
from dprc_core.distributed import all_reduce_max_int, current_ranks, shard_indices
from dprc_core.engine import PrivacyEngine
from dprc_core.losses import causal_lm_per_sample_loss
from dprc_core.noise import Gaussian
from dprc_core.training.tiny import build_tiny_llama

N_EXAMPLES, SEQ, VOCAB = 12, 6, 40
# logical batches: a mixed one, one all on rank 0 (others empty for W = 2 and 3), one larger
BATCHES = [[0, 1, 2, 3, 5, 8, 9], [0, 6], [1, 2, 4, 5, 7, 10, 11]]
METHODS = ("exact", "hutch/per_example")
NOISE_SIGMA, NOISE_C, NOISE_QN = 1.5, 2.0, 3.0
WIDE = (400, 260)  # 104,000 weights


def llama(folder: Path, lora: bool = False) -> nn.Module:
    """The tiny Llama (built with fixed seeds), in float64; with ``lora``: PEFT LoRA adapters
    (r = 2 on q_proj and v_proj) over a frozen base."""
    from transformers import AutoModelForCausalLM

    if not (folder / "config.json").exists():
        build_tiny_llama(folder, hidden=16, layers=2, max_positions=32, seed=3)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_pretrained(
        folder, torch_dtype=torch.float64, use_safetensors=True, trust_remote_code=False
    )
    if lora:
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0)
        model = get_peft_model(model, cfg)
        with torch.no_grad():  # B = 0 at init: make the adapters' gradients all non-zero
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    return model


def data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, VOCAB, (N_EXAMPLES, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[::3, -2:] = 0  # some padding
    return {"input_ids": ids, "attention_mask": mask}


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return causal_lm_per_sample_loss(model, batch)


def shard(model: nn.Module) -> nn.Module:
    """fully_shard every decoder layer, then the root."""
    for module in model.modules():
        if type(module).__name__ == "LlamaDecoderLayer":
            fully_shard(module)
    fully_shard(model)
    return model


def make_engine(model: nn.Module, method: str, sigma: float = 0.0, **kw) -> PrivacyEngine:
    name, _, sketch = method.partition("/")
    norm = Exact() if name == "exact" else Hutch(4, sketch=sketch or "shared")
    opt = kw.pop("optimizer", None) or torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=0.5
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        return PrivacyEngine(
            model,
            opt,
            clipping=Clipping(0.3, norm, check_independence=True),
            noise=Gaussian(sigma, secure=kw.pop("secure", False)),
            expected_batch_size=4.0,
            seed=7,
            **kw,
        )


def run_steps(engine: PrivacyEngine, batches, micro: int | None, part=lambda i: i) -> list[dict]:
    """One engine step per logical batch: this process's ``part``, in micro-batches; a rank
    with fewer micro-batches than the most any rank has pads (rows 0 and 1, discarded)."""
    batch_data, stats = data(), []
    padding = {k: v[:2] for k, v in batch_data.items()}
    for indices in batches:
        idx = part(torch.tensor(indices, dtype=torch.long))
        chunks = list(idx.split(micro or max(len(idx), 1))) if len(idx) else []
        most = all_reduce_max_int(len(chunks), engine.ranks)  # before any pass: in lockstep
        for chunk in chunks:
            engine.accumulate(loss_fn, {k: v[chunk] for k, v in batch_data.items()}, chunk)
        for _ in range(most - len(chunks)):
            engine.pad(loss_fn, padding)
        s = engine.step()
        stats.append({"batch_size": s.batch_size, "mean_loss": s.mean_loss})
    return stats


def whole(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole (unsharded) parameters, on every rank."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {n: t.detach().contiguous().clone() for n, t in state.items() if n in trainable}


def scenario_steps(out: Path) -> None:
    """σ = 0 steps of exact and per-example hutch, with and without micro-batches, with LoRA."""
    ranks = current_ranks()
    folder = out / "llama"
    if ranks.is_main:
        llama(folder)
    torch.distributed.barrier()
    for lora in (False, True):
        for method in METHODS:
            for micro in (None, 2):
                model = shard(llama(folder, lora))
                engine = make_engine(model, method)
                stats = run_steps(engine, BATCHES, micro, lambda i: shard_indices(i, ranks))
                tag = f"steps-{'lora-' if lora else ''}{method.replace('/', '-')}-{micro}"
                save_file(whole(model), str(out / f"{tag}-rank{ranks.rank}.safetensors"))
                (out / f"{tag}-rank{ranks.rank}.json").write_text(json.dumps(stats))
                engine.detach()


class NoisedOnEveryRank(PrivacyEngine):
    """A mutant: every rank adds full noise to its whole clipped sum before the reduction (so
    each coordinate gets W draws), the bug the noise test must catch."""

    def _add_noise_to_shards(self) -> None:
        gen = torch.Generator().manual_seed(1000 + self.ranks.rank)

        def noised(i: int) -> torch.Tensor:
            full = sharding.full_zeros(self.params[i])
            return full + self.noise.std * torch.randn(full.shape, generator=gen)

        sharding.reduce_into_shards(noised, self._layouts, self.ranks, self._shard_sums)
        super()._add_noise_to_shards()


def scenario_noise(out: Path) -> None:
    """One σ > 0 step of a wide sharded layer from zero weights with an empty batch: the update
    is the noise alone (−lr · noise / (qN)); plain, secure and the mutant."""
    ranks = current_ranks()
    for kind in ("plain", "secure", "mutant"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(*WIDE, bias=False)).double()
        with torch.no_grad():
            model[0].weight.zero_()
        fully_shard(model[0])
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        cls = NoisedOnEveryRank if kind == "mutant" else PrivacyEngine
        engine = cls(
            model,
            opt,
            clipping=Clipping(NOISE_C, Exact()),
            noise=Gaussian(NOISE_SIGMA, secure=kind == "secure"),
            expected_batch_size=NOISE_QN,
            seed=11,
        )
        engine.step()
        engine.close()
        save_file(whole(model), str(out / f"noise-{kind}-rank{ranks.rank}.safetensors"))


def scenario_mixed(out: Path) -> None:
    """σ = 0 steps of the float32 tiny Llama sharded with a bf16 mixed-precision policy
    (parameters gathered in bfloat16, gradients reduced in float32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers import AutoModelForCausalLM

    ranks = current_ranks()
    folder = out / "llama"
    if ranks.is_main:
        llama(folder)
    torch.distributed.barrier()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for module in model.modules():
        if type(module).__name__ == "LlamaDecoderLayer":
            fully_shard(module, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    engine = make_engine(model, "exact")
    run_steps(engine, BATCHES, 2, lambda i: shard_indices(i, ranks))
    save_file(whole(model), str(out / f"mixed-rank{ranks.rank}.safetensors"))


def scenario_memory(out: Path) -> None:
    """Adam on the sharded tiny Llama: the bytes of this rank's local parameters and optimizer
    state after a step, and the whole parameters' sizes (rows and bytes a row)."""
    ranks = current_ranks()
    folder = out / "llama"
    if ranks.is_main:
        llama(folder)
    torch.distributed.barrier()
    model = shard(llama(folder))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    engine = make_engine(model, "exact", sigma=1.0, optimizer=opt)
    run_steps(engine, BATCHES[:1], None, lambda i: shard_indices(i, ranks))
    local = sum(sharding.local_tensor(p).nbytes for p in model.parameters())
    state = sum(
        sharding.local_tensor(v).nbytes
        for s in opt.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dim() > 0
    )
    shapes = {n: [list(p.shape), p.element_size()] for n, p in model.named_parameters()}
    (out / f"memory-rank{ranks.rank}.json").write_text(
        json.dumps({"params": local, "state": state, "shapes": shapes})
    )


class Mixing(nn.Module):
    """Samples mix: each row minus the batch mean (float32)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        return self.b(h - h.mean(0, keepdim=True)).squeeze(-1)


def _refusal(make) -> str:
    try:
        make()
    except Exception as exc:  # noqa: BLE001 - the message is what the test reads
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def scenario_refusals(out: Path) -> None:
    """What a sharded engine refuses, each rank's messages."""
    from dprc_core.noise import NuDPFTRL

    ranks = current_ranks()
    torch.manual_seed(0)

    def sharded(model: nn.Module) -> nn.Module:
        for m in model.children():
            fully_shard(m)
        return fully_shard(model)

    def engine(model, clipping=None, noise=None) -> PrivacyEngine:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return PrivacyEngine(
            model, opt, clipping=clipping or Clipping(1.0, Exact()),
            noise=noise or Gaussian(1.0), expected_batch_size=4.0, seed=3,
        )  # fmt: skip

    def mixing() -> None:
        e = engine(sharded(Mixing()))
        x = torch.randn(4, 4)
        e.accumulate(lambda m, b: (m(b) - 1.0) ** 2, x)

    def empty() -> None:
        engine(sharded(Mixing())).accumulate(lambda m, b: m(b) ** 2, torch.zeros(0, 4))

    def partly() -> None:
        model = Mixing()
        fully_shard(model.a)  # the root (and b) left unsharded
        engine(model)

    found = {
        "mixing": _refusal(mixing),
        "two_pass": _refusal(
            lambda: engine(sharded(Mixing()), Clipping(1.0, Exact(), clipped_sum="two_pass"))
        ),
        "nu_dpftrl": _refusal(lambda: engine(sharded(Mixing()), noise=NuDPFTRL(1.0, nu=0.1))),
        "empty": _refusal(empty),
        "partly": _refusal(partly),
    }
    (out / f"refusals-rank{ranks.rank}.json").write_text(json.dumps(found))


def scenario_units(out: Path) -> None:
    """A sharded two-layer net's user-level steps: users on one rank each (steps), user 5 on
    both ranks (refused on both: no step), users on one rank each again (steps)."""
    ranks = current_ranks()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    for m in model.children():
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    engine = PrivacyEngine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        clipping=Clipping(1.0, Exact()),
        noise=Gaussian(1.0),
        expected_batch_size=4.0,
        seed=3,
    )
    x, y = torch.randn(3, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)

    def loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return (m(batch[0]).squeeze(-1) - batch[1]) ** 2

    r = ranks.rank
    result: dict = {"sizes": []}
    result["sizes"].append(
        engine.step(loss, (x, y), user_ids=[2 * r + 1] * 2 + [2 * r + 2]).batch_size
    )
    before = whole(model)
    result["users"] = _refusal(lambda: engine.step(loss, (x, y), user_ids=[5, 5, 2 * r + 1]))
    after = whole(model)
    result["unchanged"] = all(torch.equal(before[n], after[n]) for n in before)
    result["sizes"].append(
        engine.step(loss, (x, y), user_ids=[2 * r + 1, 2 * r + 2, 2 * r + 2]).batch_size
    )
    result["steps"] = engine.steps
    (out / f"units-rank{r}.json").write_text(json.dumps(result))


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    torch.distributed.init_process_group(backend="gloo")
    os.environ.setdefault("TMPDIR", tempfile.gettempdir())
    scenarios = {
        "steps": scenario_steps,
        "noise": scenario_noise,
        "memory": scenario_memory,
        "refusals": scenario_refusals,
        "mixed": scenario_mixed,
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
    # Leave without running C++ static destructors: at interpreter exit after FSDP2 on gloo a
    # background thread is sometimes destroyed while still joinable ("terminate called without
    # an active exception", SIGABRT), after every result was written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
