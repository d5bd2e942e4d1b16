"""Benchmarks of serverless-worker: throughput, calls per job, cold start, latency, cost and
the scheduler's dispatch rate, side by side with what a hand-rolled worker needs.

Run them all with ``make bench`` (``python -m benchmarks.run``); ``--quick`` runs the same
pieces with small job counts. Results go to ``bench-results/bench.json``.
"""
