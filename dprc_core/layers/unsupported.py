"""Hugging Face modules known, by class, to defeat per-sample hooks: refused at construction.

Per-sample gradients from hooks need every hooked call to see its samples along the leading
dimension. A few families break that by design, and the independence check would only find out
at the first step (or, for layouts whose shapes happen to fit, by comparing values). Known
cases are refused when the engine is built, naming the module and the reason:

* **Outputs shared by the whole batch that the model reshapes itself.** T5's relative position
  bias (``relative_attention_bias``, an embedding of a (T, T) bucket table: output (T, T, heads)
  with no batch dimension at all) in every T5-derived family; DeBERTa's relative position
  embeddings, their LayerNorm and the projections applied to them (``pos_key_proj``,
  ``pos_query_proj``, and ``query_proj`` / ``key_proj`` too when ``share_att_key`` is set):
  their outputs are computed once and then repeated over the batch by the model.
* **Sequence-first layers.** FSMT's encoder and decoder layers and XLNet run on (T, B, d).
* **Mixture-of-experts routing.** Routers (``MixtralTopKRouter``, ``Qwen2MoeTopKRouter``, …)
  return a tuple (logits, weights, expert indices), and the experts are fused 3-D parameters
  applied to a data-dependent subset of tokens each; neither has a per-sample handler. peft's
  ``target_parameters`` adapters (``ParamWrapper``) add their low-rank delta to such a fused
  parameter functionally. Attention, norms, embeddings and shared (dense) experts train.

Everything else in those models can be trained: freeze the listed modules.
"""

from __future__ import annotations

from torch import nn

_RELATIVE_BIAS_FAMILIES = (
    "t5",
    "mt5",
    "umt5",
    "longt5",
    "switch_transformers",
    "pop2piano",
    "udop",
    "pix2struct",
    "mpnet",
)
_SHARED = (
    "produces an output shared by the whole batch (no per-sample rows) that the model "
    "broadcasts or repeats itself"
)
_SEQUENCE_FIRST = "runs sequence-first (T, B, d) inside this model family"
_ROUTER = (
    "routes tokens to experts and returns a tuple (logits, weights, indices), which has "
    "no per-sample gradient handler"
)
_EXPERTS = (
    "holds fused mixture-of-experts weights (3-D, one slice per expert) applied to a "
    "data-dependent subset of tokens each, which has no per-sample gradient handler"
)
_PARAM_WRAPPER = (
    "is a peft target_parameters adapter (ParamWrapper), which adds its low-rank "
    "delta to the wrapped parameter functionally"
)


def _family(module: nn.Module) -> str:
    parts = type(module).__module__.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["transformers", "models"] else ""


def _flag(found: dict[int, str], module: nn.Module, reason: str) -> None:
    for sub in module.modules():  # peft adapters inside a flagged module share its inputs
        found.setdefault(id(sub), reason)


def known_unsupported(model: nn.Module) -> dict[int, str]:
    """id(module) -> why its parameters cannot get per-sample gradients."""
    found: dict[int, str] = {}
    for module in model.modules():
        cls = type(module).__name__
        if cls == "ParamWrapper" and type(module).__module__.startswith("peft."):
            _flag(found, module, _PARAM_WRAPPER)
            continue
        family = _family(module)
        if not family:
            continue
        if cls.endswith("Router"):
            _flag(found, module, _ROUTER)
        elif cls.endswith("Experts") and any(
            p.dim() >= 3 for p in module.parameters(recurse=False)
        ):
            _flag(found, module, _EXPERTS)
        if family in _RELATIVE_BIAS_FAMILIES:
            bias = getattr(module, "relative_attention_bias", None)
            if isinstance(bias, nn.Module):
                _flag(found, bias, "(T5-style relative position bias) " + _SHARED)
        elif family in ("deberta", "deberta_v2"):
            if cls.endswith("Encoder") and getattr(module, "relative_attention", False):
                for attr in ("rel_embeddings", "LayerNorm"):
                    sub = getattr(module, attr, None)
                    if isinstance(sub, nn.Module):
                        _flag(found, sub, "(DeBERTa relative position embeddings) " + _SHARED)
            if cls == "DisentangledSelfAttention" and getattr(module, "relative_attention", False):
                names = ["pos_key_proj", "pos_query_proj", "pos_proj", "pos_q_proj"]
                if getattr(module, "share_att_key", False):
                    names += ["query_proj", "key_proj"]
                for attr in names:
                    sub = getattr(module, attr, None)
                    if isinstance(sub, nn.Module):
                        _flag(found, sub, "(DeBERTa relative position projection) " + _SHARED)
        elif family == "fsmt" and cls in ("EncoderLayer", "DecoderLayer"):
            _flag(found, module, "(FSMT) " + _SEQUENCE_FIRST)
        elif family == "xlnet" and cls == "XLNetModel":
            _flag(found, module, "(XLNet) " + _SEQUENCE_FIRST)
    return found
