"""``POST /v1/chat/completions`` and ``POST /v1/completions``: generation with the tenant's
models, in OpenAI's shapes (service.inference)."""
