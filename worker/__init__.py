"""Job execution: the task body (``worker.execution.execute_job``), the embedded worker thread
of ``dprc serve`` and the Celery app for GPU workers. Built on ``service`` and ``dprc_core``;
never imports ``api``."""
