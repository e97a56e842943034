"""DP preference optimisation (issue 43, the library part): ``dprc_core.preference.dpo_loss``
with the privacy unit one preference pair, on a tiny float64 Llama.

* The per-pair loss equals TRL 1.16's DPOTrainer ``loss_type="sigmoid"``: TRL's own per-token
  log-probabilities (its fused LM head, ``trl.trainer.utils.add_fused_lm_head``, on a second copy
  of the model) summed as ``_compute_loss`` does, and its formula (dpo_trainer.py, 1285-1381).
* σ = 0, exact norms: the update (SGD, lr 1) is the mean over pairs of min(1, C/‖g_p‖)·g_p with
  g_p the torch.func gradient of the pair's TRL-formula loss (both rows in one function), to
  1e-10, C such that some pairs clip — in the pair layout (a pair is one sample; the engine's
  independence check on) and the row layout (``user_ids`` = pair ids), micro-batches of whole
  pairs, both clipped sums.
* Clipping each sequence (each answer's own part of ∇L_pair) gives another update: computed with
  torch.func and with the engine given rows without ``user_ids``, and told apart.
* Refusals: half a pair (one row of a pair, two chosen rows, an id met three times), a pair
  split across micro-batches, a pair met in two micro-batches, malformed pair tensors, missing
  reference log-probs; the row layout under the row-level independence check.
* ``reference_logps``: no gradient, no hook records, and a LoRA model's adapters disabled (the
  base model's log-probs).
* Per-pair Hutchinson norms are unbiased for ‖g_p‖² (z-test over 120 projections), and
  per-example sketches key a pair by its example id (the same norm whatever the micro-batches).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import dprc_core
from dprc_core import Clipping, Exact, Gaussian
from dprc_core.hooks import PerSampleHooks
from dprc_core.independence import SampleMixingError
from dprc_core.preference import dpo_loss, reference_logps, sequence_logps
from dprc_core.privacy_units import group_rows
from dprc_core.sketches import per_example_source
from tests.conftest import _Functional, trainable_named

BETA = 0.7
P, T = 5, 12


def make_pairs(model, n: int = P, seed: int = 0) -> dict[str, torch.Tensor]:
    """n pairs (n, 2, T): a shared prompt of 2-5 tokens, answers of 2-6 tokens, right padding;
    ``ref_logps`` the model's own log-probs moved by N(0, 1) (so the pairs' losses differ)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(n, 2, T, dtype=torch.long)
    mask = torch.zeros(n, 2, T, dtype=torch.long)
    labels = torch.full((n, 2, T), -100, dtype=torch.long)
    for p in range(n):
        prompt = torch.randint(1, 64, (int(torch.randint(2, 6, (), generator=g)),), generator=g)
        for a in range(2):
            answer = torch.randint(1, 64, (int(torch.randint(2, 7, (), generator=g)),), generator=g)
            row = torch.cat([prompt, answer])
            ids[p, a, : row.numel()] = row
            mask[p, a, : row.numel()] = 1
            labels[p, a, prompt.numel() : row.numel()] = answer
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    ref = reference_logps(model, batch)
    batch["ref_logps"] = ref + torch.randn(ref.shape, generator=g, dtype=ref.dtype)
    return batch


def as_rows(pairs: dict[str, torch.Tensor], seed: int = 1) -> dict[str, torch.Tensor]:
    """The row layout of the same pairs, rows shuffled (a pair's rows not adjacent)."""
    n = pairs["input_ids"].shape[0]
    perm = torch.randperm(2 * n, generator=torch.Generator().manual_seed(seed))
    rows = {k: pairs[k].reshape(2 * n, -1)[perm] for k in ("input_ids", "attention_mask", "labels")}
    rows["ref_logps"] = pairs["ref_logps"].reshape(-1)[perm]
    rows["pair"] = (torch.arange(n).repeat_interleave(2) + 100)[perm]  # ids not 0..n-1
    rows["chosen"] = torch.tensor([True, False] * n)[perm]
    return rows


def take_pairs(pairs, index):
    return {k: v[index] for k, v in pairs.items()}


def take_rows(rows, pair_ids):
    keep = torch.isin(rows["pair"], torch.tensor(pair_ids))
    return {k: v[keep] for k, v in rows.items()}


def trl_pair_losses(model, pairs) -> torch.Tensor:
    """TRL 1.16 DPOTrainer._compute_loss, loss_type="sigmoid", reverse KL, precomputed
    reference log-probs: the batch is [chosen; rejected] (line 1344: ``logps.chunk(2)``),
    ``labels = input_ids.masked_fill(completion_mask == 0, -100)`` (1297), per-token log-probs
    from the fused LM head summed over the sequence (1298-1303), log-ratios against the
    reference (1375-1376), ``-F.logsigmoid(beta * delta_score)`` (1381)."""
    ids = torch.cat([pairs["input_ids"][:, 0], pairs["input_ids"][:, 1]])
    mask = torch.cat([pairs["attention_mask"][:, 0], pairs["attention_mask"][:, 1]])
    completion = torch.cat([pairs["labels"][:, 0], pairs["labels"][:, 1]]) != -100
    labels = ids.masked_fill(~completion, -100)
    out = model(
        input_ids=ids, attention_mask=mask, labels=labels, use_cache=False, fused_lm_head=True
    )
    per_token_logps = out.log_probs[:, -(T - 1) :]
    chosen_logps, rejected_logps = per_token_logps.sum(dim=1).chunk(2, dim=0)
    ref_chosen_logps, ref_rejected_logps = pairs["ref_logps"][:, 0], pairs["ref_logps"][:, 1]
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    delta_score = chosen_logratios - rejected_logratios
    return -F.logsigmoid(BETA * delta_score)


def pair_loss_formula(logps_fn, pair) -> torch.Tensor:
    """The same formula on one pair {(2, T) tensors, ref (2,)}, log-probs from ``logps_fn``."""
    c = logps_fn(0) - pair["ref_logps"][0]
    r = logps_fn(1) - pair["ref_logps"][1]
    return -F.logsigmoid(BETA * (c - r))


def _row_logps(model, params, pair, a):
    ids = pair["input_ids"][a : a + 1]
    logits = _Functional(model, params)(
        input_ids=ids, attention_mask=pair["attention_mask"][a : a + 1]
    ).logits
    logp = torch.log_softmax(logits[0, :-1], -1)
    targets = pair["labels"][a, 1:]
    counted = targets != -100
    return logp[counted].gather(1, targets[counted][:, None]).sum()


def pair_grads(model, pairs) -> list[dict[str, torch.Tensor]]:
    """g_p = torch.func gradient of each pair's loss, both answers in one function."""
    params = {n: p.detach() for n, p in trainable_named(model).items()}
    out = []
    for p in range(pairs["input_ids"].shape[0]):
        pair = take_pairs(pairs, p)

        def loss(params, pair=pair):
            return pair_loss_formula(lambda a: _row_logps(model, params, pair, a), pair)

        out.append(torch.func.grad(loss)(params))
    return out


def answer_grads(model, pairs) -> list[tuple[dict, dict]]:
    """Each pair's gradient split by answer: ∂L/∂θ through the chosen answer's forward only and
    through the rejected one's only (their sum is g_p): what per-sequence clipping clips."""
    params = {n: p.detach() for n, p in trainable_named(model).items()}
    out = []
    for p in range(pairs["input_ids"].shape[0]):
        pair = take_pairs(pairs, p)

        def loss(pc, pr, pair=pair):
            return pair_loss_formula(
                lambda a: _row_logps(model, pc if a == 0 else pr, pair, a), pair
            )

        out.append(torch.func.grad(loss, argnums=(0, 1))(params, params))
    return out


def _norm(g: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum(v.pow(2).sum() for v in g.values()))


def clipped_mean(grads: list[dict], c: float, n: int) -> dict[str, torch.Tensor]:
    total: dict[str, torch.Tensor] = {}
    for g in grads:
        f = min(1.0, c / float(_norm(g)))
        for name, v in g.items():
            total[name] = total.get(name, 0) + f * v
    return {name: v / n for name, v in total.items()}


def _engine(model, c, check_independence=True, clipped_sum="bookkeeping", expected=float(P)):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    with warnings.catch_warnings():  # σ = 0 warns that nothing is private: intended here
        warnings.simplefilter("ignore", dprc_core.PrivacyWarning)
        return dprc_core.PrivacyEngine(
            model,
            opt,
            clipping=Clipping(
                c, Exact(), clipped_sum=clipped_sum, check_independence=check_independence
            ),
            noise=Gaussian(0.0),
            expected_batch_size=expected,
            seed=3,
        )


# ----------------------------------------------------------------------------- the loss


def test_the_pair_loss_is_trls_sigmoid_loss(tiny_llama, tiny_llama_path):
    from transformers import LlamaForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    pairs = make_pairs(tiny_llama)
    trl_model = LlamaForCausalLM.from_pretrained(tiny_llama_path, use_safetensors=True)
    trl_model = trl_model.double().eval()
    add_fused_lm_head(trl_model)
    with torch.no_grad():
        want = trl_pair_losses(trl_model, pairs)
        ours = dpo_loss(BETA)(tiny_llama, pairs)
        rows = as_rows(pairs)
        per_row = dpo_loss(BETA)(tiny_llama, rows)
    assert ours.shape == (P,)
    assert want.std() > 0.05  # pairs with distinct losses
    # TRL's fused head computes its log-probs in float32
    torch.testing.assert_close(ours, want.to(ours.dtype), rtol=1e-5, atol=1e-5)
    # rows: each row half of its pair's loss, the rows of a pair summing to it
    by_pair = torch.zeros(P, dtype=per_row.dtype).index_add_(0, rows["pair"] - 100, per_row)
    torch.testing.assert_close(by_pair, ours, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(per_row.sum(), ours.sum(), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- the update

SPLITS = {"one micro-batch": [[0, 1, 2, 3, 4]], "three": [[3], [0, 4], [1, 2]]}


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("clipped_sum", ["bookkeeping", "two_pass"])
@pytest.mark.parametrize("layout", ["pairs", "rows"])
def test_the_update_is_the_mean_of_clipped_pair_gradients(tiny_llama, layout, clipped_sum, split):
    pairs = make_pairs(tiny_llama)
    grads = pair_grads(tiny_llama, pairs)
    norms = torch.stack([_norm(g) for g in grads])
    c = float(norms.median())  # some pairs clipped, some not
    want = clipped_mean(grads, c, P)

    before = {n: p.detach().clone() for n, p in trainable_named(tiny_llama).items()}
    # the row layout's pairs fail a row-level independence check by design (see below)
    engine = _engine(tiny_llama, c, layout == "pairs", clipped_sum)
    rows = as_rows(pairs)
    for part in SPLITS[split]:
        if layout == "pairs":
            engine.accumulate(dpo_loss(BETA), take_pairs(pairs, torch.tensor(part)))
        else:
            mb = take_rows(rows, [100 + p for p in part])
            engine.accumulate(dpo_loss(BETA), mb, user_ids=mb["pair"])
    stats = engine.step()
    engine.detach()
    assert stats.batch_size == P  # the units are the pairs
    assert 0 < stats.clipped_fraction < 1
    torch.testing.assert_close(
        torch.sort(stats.per_sample_norms).values, torch.sort(norms).values, rtol=1e-10, atol=0
    )
    named = trainable_named(tiny_llama)
    update = {n: before[n] - p.detach() for n, p in named.items()}  # SGD, lr 1
    if clipped_sum == "bookkeeping":
        for name, p in named.items():
            torch.testing.assert_close(update[name], want[name], rtol=0, atol=1e-10)
            torch.testing.assert_close(p.grad, want[name], rtol=0, atol=1e-10)
    else:
        # the second backward is a plain autograd backward through the batch, and Llama's
        # RMSNorm computes in float32 even in a float64 model: a plain backward of Σ f_p·L_p
        # differs from torch.func's per pair by ~1e-8 (2e-5 elementwise) too, so the whole
        # update is compared, 1e-6 relative (the per-sequence update differs by > 1e-3)
        err = _norm({n: update[n] - want[n] for n in want})
        assert err <= 1e-6 * float(_norm(want)), (err, _norm(want))


def test_clipping_each_sequence_would_give_another_update(tiny_llama):
    pairs = make_pairs(tiny_llama)
    grads = pair_grads(tiny_llama, pairs)
    split = answer_grads(tiny_llama, pairs)
    for g, (gc, gr) in zip(grads, split, strict=True):  # the two answers' parts sum to g_p
        for name in g:
            torch.testing.assert_close(gc[name] + gr[name], g[name], rtol=0, atol=1e-12)
    c = float(torch.stack([_norm(g) for g in grads]).median())
    per_pair = clipped_mean(grads, c, P)
    per_sequence = clipped_mean([h for pair in split for h in pair], c, P)
    gap = _norm({n: per_pair[n] - per_sequence[n] for n in per_pair})
    assert gap > 1e-3 * float(_norm(per_pair)), "the test could not tell the two apart"

    # an engine clipping each answer on its own (rows without user_ids) gives per_sequence,
    # which the per-pair test above (1e-10) would refuse
    engine = _engine(tiny_llama, c, check_independence=False)
    stats = engine.step(dpo_loss(BETA), as_rows(pairs))
    engine.detach()
    assert stats.batch_size == 2 * P
    for name, p in trainable_named(tiny_llama).items():
        torch.testing.assert_close(p.grad, per_sequence[name], rtol=0, atol=1e-10)
    got = {n: p.grad for n, p in trainable_named(tiny_llama).items()}
    assert _norm({n: got[n] - per_pair[n] for n in got}) > 0.5 * gap


# ----------------------------------------------------------------------------- refusals


def test_half_pairs_are_refused(tiny_llama):
    rows = as_rows(make_pairs(tiny_llama))
    loss = dpo_loss(BETA)
    first = rows["pair"][0]
    half = {k: v[1:] for k, v in rows.items()}  # the first row's pair has lost a row
    with pytest.raises(ValueError, match=f"pair\\(s\\) \\[{int(first)}\\]"):
        loss(tiny_llama, half)
    both_chosen = dict(rows, chosen=torch.ones_like(rows["chosen"]))
    with pytest.raises(ValueError, match="exactly two rows, one chosen"):
        loss(tiny_llama, both_chosen)
    three = dict(rows, pair=torch.where(rows["pair"] == 101, 100, rows["pair"]))
    with pytest.raises(ValueError, match="exactly two rows"):
        loss(tiny_llama, three)
    with pytest.raises(ValueError, match="ref_logps"):
        loss(tiny_llama, {k: v for k, v in rows.items() if k != "ref_logps"})
    with pytest.raises(ValueError, match="'pair'"):
        loss(tiny_llama, {k: v for k, v in rows.items() if k != "pair"})
    with pytest.raises(ValueError, match="one entry per row"):
        loss(tiny_llama, dict(rows, chosen=rows["chosen"][:-1]))
    pairs = make_pairs(tiny_llama)
    with pytest.raises(ValueError, match="chosen then rejected"):
        loss(tiny_llama, {k: v[:, :1] for k, v in pairs.items()})
    with pytest.raises(ValueError, match="\\(P, 2\\)"):
        loss(tiny_llama, dict(pairs, ref_logps=pairs["ref_logps"].reshape(-1)))
    with pytest.raises(ValueError, match="must be a positive"):
        dpo_loss(0.0)


def test_a_pair_split_across_micro_batches_is_refused(tiny_llama):
    pairs = make_pairs(tiny_llama)
    rows = as_rows(pairs)
    # rows 0..4 and 5..9: an odd number of rows each, so some pair is cut in two
    for part in ({k: v[:5] for k, v in rows.items()}, {k: v[5:] for k, v in rows.items()}):
        engine = _engine(tiny_llama, 1.0, check_independence=False)
        with pytest.raises(ValueError, match="same micro-batch"):
            engine.accumulate(dpo_loss(BETA), part, user_ids=part["pair"])
        engine.detach()
    # a whole pair met again in another micro-batch of the logical batch: a unit met twice
    engine = _engine(tiny_llama, 1.0, check_independence=False)
    a, b = take_rows(rows, [100, 101]), take_rows(rows, [101, 102])
    engine.accumulate(dpo_loss(BETA), a, user_ids=a["pair"])
    with pytest.raises(ValueError, match="already contributed"):
        engine.accumulate(dpo_loss(BETA), b, user_ids=b["pair"])
    engine.detach()


def test_rows_fail_a_row_level_independence_check(tiny_llama):
    """The engine's check compares single rows, and a pair's rows depend on each other: the
    row layout is refused under it (hence check_independence=False there, and the pair layout
    as the default, whose check compares whole pairs and passes in the tests above)."""
    rows = as_rows(make_pairs(tiny_llama))
    engine = _engine(tiny_llama, 1.0, check_independence=True)
    # (a ValueError when the first two rows are not one pair: the check's batch of two is
    # then two half pairs, which the loss refuses)
    with pytest.raises((SampleMixingError, ValueError)):
        engine.step(dpo_loss(BETA), rows, user_ids=rows["pair"])
    engine.detach()


# ----------------------------------------------------------------------------- reference


def test_reference_logps_of_a_lora_model_are_the_base_models(lora_llama, tiny_llama_path):
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(tiny_llama_path, use_safetensors=True).double().eval()
    pairs = make_pairs(base)
    engine = _engine(lora_llama, 1.0)  # an engine attached: its hooks must record nothing
    ref = reference_logps(lora_llama, pairs)
    assert not ref.requires_grad and ref.shape == (P, 2)
    with torch.no_grad():
        want = sequence_logps(
            base, {k: v.reshape(2 * P, T) for k, v in pairs.items() if k != "ref_logps"}
        )
        with_adapters = sequence_logps(
            lora_llama, {k: v.reshape(2 * P, T) for k, v in pairs.items() if k != "ref_logps"}
        )
    torch.testing.assert_close(ref.reshape(-1), want, rtol=1e-12, atol=1e-12)
    assert (with_adapters - want).abs().max() > 1e-4  # the adapters matter: they were off
    assert all(p.grad is None for p in lora_llama.parameters())
    stats = engine.step(dpo_loss(BETA), dict(pairs, ref_logps=ref))  # a step after it works
    engine.detach()
    assert stats.batch_size == P and torch.isfinite(stats.per_sample_norms).all()


# ----------------------------------------------------------------------------- Hutchinson


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["pairs", "rows"])
def test_per_pair_hutchinson_is_unbiased(tiny_llama, layout):
    pairs = make_pairs(tiny_llama, n=3)
    truth = torch.stack([_norm(g) for g in pair_grads(tiny_llama, pairs)]).pow(2)
    if layout == "pairs":
        batch, groups, keys = pairs, None, [0, 1, 2]
    else:
        batch = as_rows(pairs)
        groups = group_rows(batch["pair"])
        keys = list(groups.keys)
    hooks = PerSampleHooks(tiny_llama, verified_layouts=True)
    try:
        draws = []
        for step in range(120):
            _, result = hooks.norm_pass(
                dpo_loss(BETA),
                batch,
                method="hutch",
                k=4,
                generator_for=per_example_source(5, step, keys, None),
                retain_graph=False,
                keep_contributions=False,
                groups=groups,
            )
            draws.append(result.sq_norms)
        d = torch.stack(draws)
    finally:
        hooks.remove()
    if layout == "rows":  # units in order of first appearance: back to pair order
        d = d[:, torch.argsort(torch.tensor(keys))]
    mean, se = d.mean(0), d.std(0) / d.shape[0] ** 0.5
    z = (mean - truth) / se
    assert z.abs().max() < 5.0, (mean, truth, z)
    assert (d.std(0) > 0).all()


def test_per_example_sketches_key_a_pair_by_its_index(tiny_llama):
    """Pair layout with per-example Hutchinson sketches: a pair's projections are keyed by its
    ``example_ids`` entry, so its norm is the same whatever the micro-batches."""
    from dprc_core import Hutch

    pairs = make_pairs(tiny_llama)
    clipping = Clipping(0.5, Hutch(4, sketch="per_example"))

    def norms(parts):
        opt = torch.optim.SGD(tiny_llama.parameters(), lr=0.0)
        engine = dprc_core.PrivacyEngine(
            tiny_llama, opt, clipping=clipping, noise=Gaussian(1.0), expected_batch_size=P, seed=4
        )
        for part in parts:
            idx = torch.tensor(part)
            engine.accumulate(dpo_loss(BETA), take_pairs(pairs, idx), example_ids=idx)
        got = engine.step().per_sample_norms
        engine.detach()
        return got

    order = [3, 0, 4, 1, 2]  # the pairs' ids in the split's order
    whole = norms([[0, 1, 2, 3, 4]])
    split = norms([[3], [0, 4], [1, 2]])
    torch.testing.assert_close(split, whole[order], rtol=1e-10, atol=0)
    exact = torch.stack([_norm(g) for g in pair_grads(tiny_llama, pairs)])
    assert not torch.allclose(whole, exact, rtol=1e-3)  # sketched, not exact
