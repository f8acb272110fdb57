"""Worker: serves work assignments with an inference engine (sim; vLLM next)."""
