"""What the benchmark scripts share: the two clients, the daemon and other child processes, CPU
accounting from /proc, the workload's messages (``benchmarks/README.md`` has the map)."""
