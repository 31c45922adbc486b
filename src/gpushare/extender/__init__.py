"""The gpushare scheduler extender: kube-scheduler's filter, prioritize and bind for GPU shares.

requests.py turns a pod into placement requests, cache.py keeps the cluster's view (nodes,
pods' shares, a Ledger), verbs.py answers kube-scheduler with the placement engine,
server.py is the HTTP server, watch.py the link to the API server and binding.py its
Binding calls.
"""
