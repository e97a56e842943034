"""API service (FastAPI). Filled in by the service issues."""
