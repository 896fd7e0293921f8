"""The rule language: file schema, safe loading with file:line:col, conditions, static analysis."""
