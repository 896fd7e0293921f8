"""The attention runtime: KV cache pools, ForwardBatch, layer specs, and backends.

Imported only by code that runs attention (it imports torch). Every backend is built from a Plan
and reads no server argument.
"""
