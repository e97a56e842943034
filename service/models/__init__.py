"""Models: the local allow-list, the built-in models and the tenant's fine-tuned ``ft:``
models. Over ``data``."""
