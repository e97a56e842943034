"""Celery worker. Filled in by the service issues."""
