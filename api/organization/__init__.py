"""A tenant's governance under ``/v1/organization``: its API keys and its audit log (admins
only; docs/governance.md)."""
