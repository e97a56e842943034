"""The HTTP API (FastAPI): the app, one router per domain under ``/v1`` with its request and
response schemas and the HTTP-side use cases that build them, and ``api.errors``, which maps
the domain errors of ``service`` to HTTP statuses. Never imports ``worker``: the dispatcher is
injected (``dprc serve``)."""
