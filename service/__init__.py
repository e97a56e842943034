"""The domain layer, shared by the HTTP API (``api``) and the workers (``worker``), in rooms
each over the ones before it: ``base`` → ``store`` → ``governance`` → ``budget`` → ``data`` →
``models`` → ``jobs`` → ``admin`` (docs/design.md §1 and its module map). No FastAPI and no
Celery here."""
