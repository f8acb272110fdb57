"""Scheduler: assigns accepted requests to live workers."""
