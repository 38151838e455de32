"""Figures with deterministic PNG bytes."""
