"""``DPSFTTrainer``: TRL's ``SFTTrainer`` with DPTrainer's DP-SGD(-RC) steps.

Needs the optional ``trl`` extra (``pip install 'dprc[trl]'``); importing this module without
TRL raises an ImportError that says so. Everything of :class:`DPTrainer` applies (Poisson
batches, noise once per logical batch, ε in the logs, the refusals); in addition SFT's packing
and padding-free collation are refused, because they put several examples into one row and
the unit of privacy is one example (one row).
"""

from __future__ import annotations

from typing import Any

try:
    from trl import SFTTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "DPSFTTrainer needs TRL: install the optional extra, pip install 'dprc[trl]'"
    ) from exc

from dprc_core.integrations.hf_trainer import DPTrainer, DPTrainerError


class DPSFTTrainer(DPTrainer, SFTTrainer):
    """``trl.SFTTrainer`` whose optimizer steps are DP steps: pass ``privacy_args`` besides
    SFTTrainer's arguments (an ``SFTConfig`` with ``packing=False``, ``padding_free=False``
    and ``max_grad_norm=0``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        config = kwargs.get("args", args[1] if len(args) > 1 else None)
        reasons = []
        if getattr(config, "packing", False):
            reasons.append(
                "SFTConfig.packing: packing concatenates several examples into one row; a row "
                "must be one example, the unit of privacy"
            )
        if getattr(config, "padding_free", False):
            reasons.append(
                "SFTConfig.padding_free: it flattens the batch's examples into one row; a row "
                "must be one example, the unit of privacy"
            )
        if reasons:
            raise DPTrainerError("DPSFTTrainer refuses this setup:\n- " + "\n- ".join(reasons))
        super().__init__(*args, **kwargs)
