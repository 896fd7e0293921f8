"""The shipped rules.yaml, tested section by section (one module a section of rules.yaml)."""
