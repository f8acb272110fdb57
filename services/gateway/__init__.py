"""Gateway: the OpenAI-compatible HTTP entry to the request path."""
