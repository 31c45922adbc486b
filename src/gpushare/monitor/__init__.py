"""The node agent: Prometheus metrics for the node's GPUs and containers, and the watchdog.

Small modules, each with one concern: ``nvml`` (GPU samples), ``statefile`` (the interception
library's per-container state file), ``cgroup`` (which container a process belongs to),
``pods`` (the node's GPU containers from their pods' annotations), ``attribution`` (GPU
processes to containers), ``collector`` (the metrics, built on each scrape), ``watchdog`` (stops
containers over their memory limit), ``kube`` (the API server: the pod watch and Events),
``server`` (the HTTP endpoint) and ``inspect`` (the `kubectl gpushare inspect` table).
docs/metrics.md documents the metrics; docs/monitor.md the agent.
"""
