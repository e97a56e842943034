"""Generation with a tenant's models: which model a request names and where it is served (the
embedded engine, a process of its own, or vLLM), the engine's process and the client that
relays requests to it. Over ``models``."""
