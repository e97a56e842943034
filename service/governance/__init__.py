"""Who may do what: roles, API keys and the caller, the audit log, dashboard sessions.
Over ``store``."""
