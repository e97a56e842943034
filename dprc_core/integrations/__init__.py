"""Integrations with other training libraries (imported lazily: ``import dprc_core`` does not
import transformers' Trainer or TRL).

* :class:`PrivacyArguments` — the DP settings, usable with ``transformers.HfArgumentParser``;
* :class:`DPTrainer` — ``transformers.Trainer`` with DP-SGD(-RC) (:mod:`.hf_trainer`);
* :class:`DPSFTTrainer` — TRL's ``SFTTrainer`` with the same (:mod:`.trl_sft`; needs the
  ``trl`` extra);
* :class:`DPDPOTrainer` — TRL's ``DPOTrainer`` with the same, one preference pair one privacy
  unit (:mod:`.trl_dpo`; needs the ``trl`` extra).
"""

from __future__ import annotations

from typing import Any

from dprc_core.integrations.privacy_arguments import PrivacyArguments

__all__ = ["DPDPOTrainer", "DPSFTTrainer", "DPTrainer", "DPTrainerError", "PrivacyArguments"]


def __getattr__(name: str) -> Any:
    if name in ("DPTrainer", "DPTrainerError"):
        from dprc_core.integrations import hf_trainer

        return getattr(hf_trainer, name)
    if name == "DPSFTTrainer":
        from dprc_core.integrations.trl_sft import DPSFTTrainer

        return DPSFTTrainer
    if name == "DPDPOTrainer":
        from dprc_core.integrations.trl_dpo import DPDPOTrainer

        return DPDPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
