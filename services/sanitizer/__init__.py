"""Sanitizer: input checks before scheduling (output PII masking comes later)."""
