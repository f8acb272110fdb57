"""The LLMService operator (kopf): each LLMService's worker Deployment and rule file
applied, its settings and rollouts sent on the bus, its status phase written. The
decisions are inferbus/llmservice/render.py's; this is the adapter."""
