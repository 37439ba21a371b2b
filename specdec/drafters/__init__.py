"""Drafting methods: one module per method, the shared interface in :mod:`.base`, the table of
methods in :mod:`.registry` (import it to look a method up; importing this package imports nothing)."""
