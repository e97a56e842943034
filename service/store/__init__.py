"""Persistence: the database engine and sessions, the ORM rows, the store that opens them,
the job statuses, the ledger folder and the metrics read from rows. Over ``base``."""
