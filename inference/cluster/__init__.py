"""A deployment of several inference services: the Redis registry of their heartbeats and placements,
the web tier's routing of sessions onto them, a service process's membership (TCP listener, heartbeat,
metrics port), and the Prometheus families built from their statuses."""
