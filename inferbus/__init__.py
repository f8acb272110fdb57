"""inferbus: LLM inference platform over NATS JetStream."""

__version__ = "0.1.0"
