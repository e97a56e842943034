"""``nn.Embedding``: the activation is a one-hot matrix that is never materialised.

Per-sample weight gradient ``onehot(ids_i)ᵀ G_i`` (V×d); rows of ``padding_idx`` get no gradient
(as in PyTorch's own backward).
"""

from __future__ import annotations

from torch import nn

from dprc_core.estimators import MatrixContribution, OneHot
from dprc_core.layers.base import LayerHandler, register


def _check(module: nn.Embedding) -> None:
    if module.max_norm is not None:
        raise ValueError(
            "nn.Embedding with max_norm renormalises weights in the forward; "
            "per-sample gradients are not supported for it"
        )
    if module.sparse or module.scale_grad_by_freq:
        raise ValueError(
            "nn.Embedding with sparse=True or scale_grad_by_freq=True is not "
            "supported (the latter mixes samples through token frequencies)"
        )


def _capture(module, inputs, output):
    ids = inputs[0].detach()
    return ids.reshape(ids.shape[0], -1) if ids.dim() > 1 else ids[:, None]


def _contributions(module: nn.Embedding, ids, g):
    if not module.weight.requires_grad:
        return {}
    ids = ids.clone()
    if module.padding_idx is not None:
        ids[ids == module.padding_idx] = -1
    return {"weight": MatrixContribution(left=OneHot(ids, module.num_embeddings), right=g)}


register(nn.Embedding)(
    LayerHandler(
        capture=_capture,
        contributions=_contributions,
        check=_check,
        params=("weight",),
        one_hot=True,
    )
)
