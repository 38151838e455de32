"""One module per Snakemake rule, named after it; each has one `run(...)` that `rffm <rule>` calls."""
