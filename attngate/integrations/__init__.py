"""Adapters to other projects; imported only by code that needs them (they may import torch)."""
