"""inferbus up's supervisor: a pure core and the process adapter."""
