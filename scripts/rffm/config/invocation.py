"""What the Snakemake invocation parsing the workflow says: the config files it read, whether jobs run on this
machine, whether files are local; and the Snakefile's own configfile checked before Snakemake reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.config.files import read
from rffm.errors import ConfigError


def snakemake_settings(workflow: Any) -> dict[str, Any]:
    """`check`'s keyword arguments for the workflow Snakemake is parsing (common.smk passes its `workflow`)."""
    settings = workflow.config_settings
    # Replacing the workflow config (rffm posttrain) discards the Snakefile's `configfile:`; only the given files count.
    replaced = settings.replace_workflow_config and settings.overwrite_config
    files = workflow.overwrite_configfiles if replaced else workflow.configfiles
    # The executor is chosen only after the Snakefile is parsed (workflow.local_exec is always True here), but the
    # command line has been read: a local run has cores and no node count; a cluster run (SLURM, Google Batch)
    # has --jobs as its node count, a dry run runs nothing, and a job already on a node or VM (remote mode) or in
    # a subprocess of the local run was checked by the Snakemake that started it.
    resources = workflow.resource_settings
    runs_here = (
        resources.cores is not None
        and resources.nodes is None
        and not getattr(workflow.output_settings, "dryrun", False)
        and not workflow.remote_exec
        and not workflow.subprocess_exec
    )
    # With a default storage provider (profiles/gcp-batch) results and inputs are objects in a bucket, not local paths.
    local_files = workflow.storage_settings.default_storage_provider is None
    return {"files": [Path(f) for f in files], "runs_here": runs_here, "local_files": local_files}


def check_default_file(path: str | Path, workflow: Any) -> None:
    """The Snakefile's own configfile, before Snakemake loads it: an empty or non-mapping file stops with the
    workflow's one line (PlanRefused) instead of Snakemake's generic message. Files given with --configfile are
    read by Snakemake's command line before any workflow code runs, so their message stays Snakemake's."""
    from rffm.errors import PlanRefused

    settings = workflow.config_settings
    if (settings.replace_workflow_config and settings.overwrite_config) or not Path(path).is_file():
        return
    try:
        read(path)
    except ConfigError as error:
        raise PlanRefused(f"rffm: {error}") from None
