"""The composition root: the ``dprc`` console command (the library's commands plus ``serve``
and ``keys``) and the served app with its dispatcher (embedded worker, Celery queue or none)
chosen from the settings. The only package that imports ``api``, ``worker`` and ``service``."""
