"""Benchmarks (`rffm bench cache|staging`): measured side by side, never imported by a step."""
