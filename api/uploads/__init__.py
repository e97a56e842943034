"""Files uploaded in parts (the OpenAI Uploads API)."""
