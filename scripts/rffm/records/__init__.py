"""What vouches for results: files, sealed records, sentinels, the step wrapper, code digests, provenance, the results
store, ledger, memo, launch and plan records, the rebuild command, manifest, the pipeline table, the selection
rule's order (ranking), and every file name (layout)."""
