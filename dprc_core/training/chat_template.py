"""The chat template a model is trained and served with: the tokenizer's own where it has one,
else :data:`DEFAULT_CHAT_TEMPLATE` (documented in docs/data.md, "Chat lines").

The default is a Zephyr-like template that needs no special token beyond the tokenizer's end of
sequence: each message is ``<|role|>`` and a newline, its content, the end-of-sequence token and
a newline; a generation prompt is ``<|assistant|>`` and a newline. The assistant's content and
its end-of-sequence token sit inside ``{% generation %}`` markers, so the tokens trained are
exactly the answer and the token that ends it (the model learns to stop), as transformers'
``return_assistant_tokens_mask`` and TRL's ``assistant_only_loss`` read them. A job that trains
chat lines with the default saves it in its checkpoint's tokenizer, so a served fine-tune (the
embedded engine or vLLM) renders prompts the way it was trained."""

from __future__ import annotations

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
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and own.strip():
        return own
    return DEFAULT_CHAT_TEMPLATE
