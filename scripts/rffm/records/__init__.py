"""What vouches for results: files, sentinels, the step wrapper, code digests, provenance, the results
store, ledger, memo, launch records, manifest, and every file name (layout)."""
