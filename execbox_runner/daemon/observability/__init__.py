"""What the daemon tells its operator: log lines (``logs``), Prometheus metrics (``metrics``),
session records for replay (``records``) and the HTTP endpoints for health, readiness and metrics
(``endpoints``). Nothing here touches a socket path or a worker."""
