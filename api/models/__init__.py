"""Allow-listed base models (``GET /v1/models``)."""
