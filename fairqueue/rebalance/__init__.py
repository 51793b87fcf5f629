"""The rebalance pass: adopting untagged jobs, promoting overdue ones, rebasing tags
and recording the dashboard's history, as leader of a queue (``passes``), and the loop
``rebalance_fair`` runs it in (``rebalancer``)."""
