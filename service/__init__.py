"""The domain layer, shared by the HTTP API (``api``) and the workers (``worker``): settings,
the store (engine, tables, migrations), the job lifecycle (statuses, transitions, leases),
budget settlement, privacy planning, the model registry, the worker-side job operations, the
``Dispatcher`` protocol and the domain errors. No FastAPI and no Celery here."""
