"""The chat template a model is trained and served with: the tokenizer's own where it has one
(trained through TRL's training version where it has no generation markers), else
:data:`DEFAULT_CHAT_TEMPLATE` (documented in docs/data.md, "Chat lines").

The default is a Zephyr-like template that needs no special token beyond the tokenizer's end of
sequence: each message is ``<|role|>`` and a newline, its content, the end-of-sequence token and
a newline; a generation prompt is ``<|assistant|>`` and a newline. The assistant's content and
its end-of-sequence token sit inside ``{% generation %}`` markers, so the tokens trained are
exactly the answer and the token that ends it (the model learns to stop), as transformers'
``return_assistant_tokens_mask`` and TRL's ``assistant_only_loss`` read them. A job that trains
chat lines with the default saves it in its checkpoint's tokenizer, so a served fine-tune (the
embedded engine or vLLM) renders prompts the way it was trained."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def chat_template_of(tokenizer: Any) -> str:
    """The template ``tokenizer`` renders chats with: its own, else the default."""
    return own_chat_template(tokenizer) or DEFAULT_CHAT_TEMPLATE


_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def own_chat_template(tokenizer: Any) -> str | None:
    """The tokenizer's own template (a template shipped as named variants: its ``default``),
    or None."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):
        own = own.get("default")
    return own if isinstance(own, str) and own.strip() else None


def has_generation_markers(template: str) -> bool:
    """Whether ``template`` marks the assistant's answers with ``{% generation %}`` (any
    whitespace-trim variant), as transformers and TRL look for them."""
    return _GENERATION.search(template) is not None


def chat_template_key(tokenizer: Any) -> dict[str, Any]:
    """What decides how chat and prompt-completion lines become tokens beyond the tokenizer's
    vocabulary: its own template, the default, the special tokens a template reads (and the
    end-of-sequence token a completion ends with) and, for an own template without generation
    markers, the TRL version whose training template replaces it. Part of a tokenized store's
    key (token_store.py)."""
    own = own_chat_template(tokenizer)
    trl_version = None
    if own is not None and not has_generation_markers(own):
        try:
            trl_version = importlib.metadata.version("trl")
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover - TRL is installed
            trl_version = "absent"
    return {
        "own": own,
        "default": DEFAULT_CHAT_TEMPLATE,
        "special_tokens": {
            k: str(v) for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items()
        },
        "trl": trl_version,
    }


def training_chat_template(tokenizer: Any) -> str:
    """The template chat lines are trained with (docs/data.md, "Chat lines"): the tokenizer's
    own when it marks the answers with ``{% generation %}``; an own template without markers
    replaced by TRL's training version of it
    (``trl.chat_template_utils.get_training_chat_template``) where TRL knows it; no own
    template: :data:`DEFAULT_CHAT_TEMPLATE`. Raises ValueError naming the model when the own
    template has no markers and TRL does not know it (what is trained could not be told)."""
    own = own_chat_template(tokenizer)
    if own is None:
        return DEFAULT_CHAT_TEMPLATE
    if has_generation_markers(own):
        return own
    from trl.chat_template_utils import get_training_chat_template

    try:
        patched = get_training_chat_template(tokenizer)
    except Exception:  # TRL raises ValueError for a template it cannot patch
        patched = None
    if isinstance(patched, str) and has_generation_markers(patched):
        return patched
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    raise ValueError(
        f"the chat template of model {name!r} does not mark the assistant's answers with "
        "{% generation %} ... {% endgeneration %} and TRL has no training version of it, so "
        "the answers (the tokens trained) cannot be told from the rest: add the markers "
        "around each assistant answer (and its end-of-turn token) in the tokenizer's "
        "chat_template (tokenizer_config.json or chat_template.jinja), or train "
        '{"prompt", "completion"} or {"text"} lines instead (docs/data.md, "Chat lines")'
    )
