"""Tenants and API keys: checked on every request (``GET /v1/me`` says whose key it is);
managed on the server's shell and under ``/v1/organization`` (:mod:`api.organization`)."""
