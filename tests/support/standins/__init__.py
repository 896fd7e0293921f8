"""CPU stand-ins of the kernel packages the GPU backends call (FlashInfer, ``flash_attn.cute``).

Each stand-in has the real API's signatures, validates its arguments the way the real kernel needs
them (and raises ``ValueError`` listing every problem), keeps exactly what ``plan()`` was given, and
computes attention in torch from that alone, split-KV included. The CPU suite runs the backends'
metadata code through them; tests/gpu/test_standin_drift.py runs the same cases through the real
kernels and the stand-ins side by side, so the two cannot drift apart.
"""
