"""KV spill: the worker's vLLM KV connector and its host-memory and disk tiers."""
