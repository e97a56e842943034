"""Tenants and API keys: created and revoked from the CLI, checked on every request."""
