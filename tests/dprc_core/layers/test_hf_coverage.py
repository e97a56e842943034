"""Every architecture of the tiny Hugging Face zoo (tests/hf_zoo.py), full fine-tuning and
LoRA: the engine either refuses the model at construction with an error naming a module or
parameter of the model, or its exact norms and one σ=0 step equal torch.func per-sample
gradients to 1e-10 (float64). A refusal at step time fails.

With ``DPRC_COVERAGE_OUT=<dir>`` each test writes its outcome to ``<dir>/<arch>-<mode>.json``
(scripts/hf_coverage_table.py turns them into the table in docs/engine.md).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
import transformers

import dprc_core
from dprc_core import Clipping, Exact, Gaussian
from tests.conftest import grad_norms, torch_func_per_sample_grads, trainable_named
from tests.hf_zoo import ARCHS, with_lora

MODES = ("full", "lora")
RTOL = 1e-10
# Some families' norm layers compute in float32 even in a float64 model (Gemma's, Cohere's,
# Helium's RMSNorm / LayerNorm multiply by the weight in float32): their weights' reference
# gradients are float32-rounded by the model itself, so those parameters (and only those) are
# compared at float32 precision. Which parameters that is, is measured, not listed.
RTOL_FLOAT32_INTERNAL = 1e-6
REFUSALS = (dprc_core.UnsupportedModuleError, ValueError, TypeError)


def _first_line(exc: BaseException) -> str:
    """The message's first line, plus assert_close's "Greatest ... difference" lines."""
    lines = str(exc).strip().splitlines() or [""]
    extra = [ln.strip() for ln in lines[1:] if ln.strip().startswith("Greatest")]
    return f"{type(exc).__name__}: " + "; ".join([lines[0], *extra])


class _Record:
    """Writes the test's outcome as JSON into $DPRC_COVERAGE_OUT (if set), also on failure."""

    def __init__(self, arch: str, mode: str):
        self.data = {"arch": arch, "mode": mode, "transformers": transformers.__version__}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and not isinstance(exc, pytest.skip.Exception):
            self.data.setdefault("stage", "?")
            self.data["outcome"] = f"FAILS at {self.data['stage']}: {_first_line(exc)}"
        elif exc is not None:
            self.data["outcome"] = f"skipped: {exc}"
        out = os.environ.get("DPRC_COVERAGE_OUT")
        if out:
            path = Path(out) / f"{self.data['arch']}-{self.data['mode']}.json"
            path.write_text(json.dumps(self.data, indent=1))
        return False


def _reference(model, loss_fn, batch, record) -> dict[str, torch.Tensor]:
    """torch.func per-sample gradients (conftest: vmap, else grad per sample); if torch.func
    cannot run the model at all, plain autograd on each one-sample batch."""
    try:
        record["reference"] = "torch.func"
        return torch_func_per_sample_grads(model, loss_fn, batch)
    except Exception as exc:  # noqa: BLE001 - recorded, then the fallback
        record["reference"] = f"autograd per sample (torch.func failed: {_first_line(exc)})"
    params = trainable_named(model)
    rows = []
    for i in range(batch["input_ids"].shape[0]):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        grads = torch.autograd.grad(
            loss_fn(model, one)[0], list(params.values()), allow_unused=True
        )
        rows.append(
            [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params.values())]
        )
    return {n: torch.stack([r[j] for r in rows]) for j, n in enumerate(params)}


def float32_internal_parameters(model) -> set[str]:
    """Names of trainable parameters owned by leaf modules whose output on a float64 input is
    exactly representable in float32 (they compute in float32 internally)."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not own or next(module.children(), None) is not None:
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
            continue
        x = torch.randn(
            2, 3, weight.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(0)
        )
        try:
            with torch.no_grad():
                y = module(x)
        except Exception:  # noqa: BLE001 - not a module that takes one hidden-state tensor
            continue
        if isinstance(y, torch.Tensor) and torch.equal(y, y.float().double()):
            names |= {f"{prefix}.{n}" if prefix else n for n in own}
    return names


def _names_of(model) -> set[str]:
    names = {n for n, _ in model.named_modules() if n}
    names |= {n for n, _ in model.named_parameters(remove_duplicate=False)}
    names |= {type(m).__name__ for m in model.modules()}
    return names


def refused_class(model, message: str) -> str | None:
    """The class of the module the message names (``module '<name>'``), else the longest class
    name of the model's modules that appears in it."""
    modules = dict(model.named_modules())
    match = re.search(r"module '([^']*)'", message)
    if match and match.group(1) in modules:
        return type(modules[match.group(1)]).__name__
    found = [type(m).__name__ for m in modules.values() if type(m).__name__ in message]
    return max(found, key=len, default=None)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ARCHS))
def test_engine_exact_or_refused_at_construction(name, mode, tmp_path):
    arch = ARCHS[name]
    with _Record(name, mode) as rec:
        rec.data["stage"] = "build"
        model = arch.build(tmp_path / name)
        if mode == "lora":
            model = with_lora(model, arch)
        else:
            model.requires_grad_(True)
        loss_fn, batch = arch.loss_fn, arch.batch()
        params = trainable_named(model)
        float32_internal = float32_internal_parameters(model)
        if float32_internal:
            rec.data["float32_internal"] = sorted(float32_internal)

        rec.data["stage"] = "reference"
        per_sample = _reference(model, loss_fn, batch, rec.data)
        ref_norms = grad_norms(per_sample)
        clip = float(ref_norms.median())  # some samples clipped, some not
        before = {n: p.detach().clone() for n, p in params.items()}

        rec.data["stage"] = "construction"
        opt = torch.optim.SGD(list(params.values()), lr=1.0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", dprc_core.PrivacyWarning)
                engine = dprc_core.PrivacyEngine(
                    model,
                    opt,
                    clipping=Clipping(clip, Exact(), clipped_sum="bookkeeping"),
                    noise=Gaussian(0.0),
                    expected_batch_size=4.0,
                )
        except REFUSALS as exc:
            message = str(exc)
            named = sorted(n for n in _names_of(model) if n in message)
            assert named, f"the refusal names no module or parameter of the model: {message}"
            rec.data["outcome"] = f"refused at construction: {_first_line(exc)}"
            rec.data["refused_class"] = refused_class(model, message)
            return

        try:
            rec.data["stage"] = "per_sample_grad_norms"
            # with the engine's independence check, which also admits batch-major flattened
            # layouts (OPT's MLP) as the engine does
            norms = dprc_core.per_sample_grad_norms(
                model, loss_fn, batch, method="exact", check_independence=True
            )
            torch.testing.assert_close(norms, ref_norms, rtol=RTOL, atol=0)

            rec.data["stage"] = "step"
            engine.step(loss_fn, batch)
        finally:
            engine.detach()

        rec.data["stage"] = "update"
        factors = (clip / ref_norms).clamp(max=1.0)
        want = {n: torch.einsum("b,b...->...", factors, g) / 4.0 for n, g in per_sample.items()}
        scale = max(float(w.abs().max()) for w in want.values())
        for n, p in params.items():
            rtol = RTOL_FLOAT32_INTERNAL if n in float32_internal else RTOL
            torch.testing.assert_close(
                before[n] - p.detach(),
                want[n],
                rtol=rtol,
                atol=rtol * scale,
                msg=lambda m, n=n: f"{n}: {m}",
            )
        rec.data["stage"] = "done"
        rec.data["outcome"] = "exact"
