"""``nn.Embedding`` subclasses whose forward is ``out[..., :] = s · weight[index(inputs)]``.

Hugging Face has many: scaled word embeddings (Gemma's ``×√d``, Bart / mBART / BioGPT / M2M100
``scale_embedding``) and learned positional embeddings that compute their indices from an
attention mask or a sequence length plus an offset (OPT, Bart, BioGPT). Rather than copying each
class's index arithmetic, the handler *reads* the map off the module's own ``forward``: it runs
that forward once more (hooks bypassed, no autograd) with the weight replaced by a two-column
code table ``[j, 1]`` for row ``j``, which returns ``s·index`` and ``s`` at every position.

Then it **verifies** the model: ``s · weight[index]`` recomputed from the real weight must equal
the real output (to the rounding of the output's dtype). A forward that is not of this form —
an added bias, a mixing of positions, a reshape — fails that check and is refused with an error
naming the module, so a future change in transformers cannot silently give wrong norms.

Per-sample weight gradient: ``onehot(index_i)ᵀ (s_i ⊙ G_i)``; rows of ``padding_idx`` get none.
Register your own subclass of this form with
``dprc_core.register(MyEmbedding)(dprc_core.layers.scaled_embedding.HANDLER)``.
"""

from __future__ import annotations

import torch
from torch import nn

from dprc_core.estimators import MatrixContribution, OneHot
from dprc_core.layers.base import LayerHandler, UnsupportedModuleError, register_by_name
from dprc_core.layers.embedding import _check
from dprc_core.layers.probing import own_forward

# Hugging Face classes (transformers 4.46 – 5.x) of the form s · weight[index(inputs)].
HF_CLASSES = (
    "transformers.models.gemma.modeling_gemma.GemmaTextScaledWordEmbedding",
    "transformers.models.gemma2.modeling_gemma2.Gemma2TextScaledWordEmbedding",
    "transformers.models.gemma3.modeling_gemma3.Gemma3TextScaledWordEmbedding",
    "transformers.models.vaultgemma.modeling_vaultgemma.VaultGemmaTextScaledWordEmbedding",
    "transformers.models.bart.modeling_bart.BartScaledWordEmbedding",
    "transformers.models.bart.modeling_bart.BartLearnedPositionalEmbedding",
    "transformers.models.mbart.modeling_mbart.MBartScaledWordEmbedding",
    "transformers.models.mbart.modeling_mbart.MBartLearnedPositionalEmbedding",
    "transformers.models.plbart.modeling_plbart.PLBartScaledWordEmbedding",
    "transformers.models.plbart.modeling_plbart.PLBartLearnedPositionalEmbedding",
    "transformers.models.biogpt.modeling_biogpt.BioGptScaledWordEmbedding",
    "transformers.models.biogpt.modeling_biogpt.BioGptLearnedPositionalEmbedding",
    "transformers.models.opt.modeling_opt.OPTLearnedPositionalEmbedding",
    "transformers.models.blenderbot.modeling_blenderbot.BlenderbotScaledWordEmbedding",
    "transformers.models.blenderbot.modeling_blenderbot.BlenderbotLearnedPositionalEmbedding",
    "transformers.models.blenderbot_small.modeling_blenderbot_small."
    "BlenderbotSmallLearnedPositionalEmbedding",
    "transformers.models.bigbird_pegasus.modeling_bigbird_pegasus."
    "BigBirdPegasusScaledWordEmbedding",
    "transformers.models.bigbird_pegasus.modeling_bigbird_pegasus."
    "BigBirdPegasusLearnedPositionalEmbedding",
    "transformers.models.pegasus_x.modeling_pegasus_x.PegasusXScaledWordEmbedding",
    "transformers.models.m2m_100.modeling_m2m_100.M2M100ScaledWordEmbedding",
    "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeScaledWordEmbedding",
    "transformers.models.xglm.modeling_xglm.XGLMScaledWordEmbedding",
)


def _fail(module: nn.Module, why: str) -> UnsupportedModuleError:
    return UnsupportedModuleError(
        f"{type(module).__name__}: its forward is not of the form scale * weight[index] "
        f"({why}); register a handler for it with dprc_core.register"
    )


def _capture(module: nn.Embedding, args, output: torch.Tensor, kwargs) -> tuple:
    weight = module.weight
    rows = weight.shape[0]
    with torch.no_grad():
        codes = torch.ones(rows, 2, dtype=torch.float64, device=weight.device)
        codes[:, 0] = torch.arange(rows, dtype=torch.float64, device=weight.device)
        try:
            probe = own_forward(module, args, kwargs, weight=codes)
        except Exception as exc:  # a forward that depends on the weight's shape
            raise _fail(module, f"probing the forward raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(probe, torch.Tensor) or probe.shape[-1] != 2:
            raise _fail(module, "the probe did not return one row per position")
        if probe.shape[:-1] != output.shape[:-1]:
            if probe.shape[0] == 1 and probe.shape[1:-1] == output.shape[1:-1]:
                probe = probe.expand(output.shape[0], *probe.shape[1:])  # broadcast over batch
            else:
                raise _fail(module, "the probe's shape differs from the output's")
        scale = probe[..., 1]
        if not bool(torch.isfinite(scale).all()) or bool((scale == 0).any()):
            raise _fail(module, "the scale is zero or not finite")
        index = probe[..., 0] / scale
        rounded = index.round()
        if not bool(((index - rounded).abs() <= 1e-6 * rows).all()) or bool(
            ((rounded < 0) | (rounded >= rows)).any()
        ):
            raise _fail(module, "the probe did not read whole rows of the weight")
        index = rounded.long()
        expected = weight.detach().to(torch.float64)[index] * scale[..., None]
        eps = torch.finfo(output.dtype).eps if output.dtype.is_floating_point else 0.0
        if not torch.allclose(expected, output.detach().to(torch.float64), rtol=2 * eps, atol=0):
            raise _fail(module, "scale * weight[index] does not reproduce the output")
    batch = index.shape[0] if index.dim() > 1 else 1
    return index.reshape(batch, -1), scale.reshape(batch, -1)


def _contributions(module: nn.Embedding, saved, g: torch.Tensor):
    if not module.weight.requires_grad:
        return {}
    index, scale = saved
    index = index.clone()
    if module.padding_idx is not None:
        index[index == module.padding_idx] = -1
    right = g * scale.to(g.dtype)[:, :, None]
    return {"weight": MatrixContribution(left=OneHot(index, module.num_embeddings), right=right)}


HANDLER = LayerHandler(
    capture=_capture,  # type: ignore[arg-type]  # 4 arguments: capture_kwargs=True below
    contributions=_contributions,
    check=_check,
    params=("weight",),
    one_hot=True,
    capture_kwargs=True,
)
register_by_name(*HF_CLASSES)(HANDLER)
