"""Outputs and the engine: the Plan, resolve(), the Explanation."""
