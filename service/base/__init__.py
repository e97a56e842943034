"""The service's foundation: settings, errors, the clock, ids, pagination and logging.
Imports no other room."""
