"""The ``LLMService`` resource: one model served with its scaling, checks and
observability, declared once (``spec``), rendered by a pure core (``render``) to what
Kubernetes runs (the operator, inferbus/operator) and to what the running services
follow (the same record under ``inferbus up``: ``inferbus apply -f``)."""
