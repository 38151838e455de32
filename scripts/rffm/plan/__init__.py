"""Plan-time code: what the Snakefile calls while Snakemake builds the plan (the one place that reads `workflow.*`)."""
