"""The worker pool: workers kept warm and leased to executions (``pool``), the daemon's handle on one
worker process and its channel (``worker``), the zygote that forks them, seen from the daemon
(``zygote_client``), and reaping what exits (``reaper``)."""
