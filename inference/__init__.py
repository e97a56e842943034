"""dprc's embedded generation engine: an OpenAI-compatible server process.

``python -m inference --host 127.0.0.1 --port P`` serves the subset of vLLM's OpenAI-compatible
API that dprc routes tenants' requests to (chat and text completions, streaming, LoRA adapter
registration), so the same router works against vLLM. It imports ``dprc_core`` only. See
docs/inference_engine.md.
"""
