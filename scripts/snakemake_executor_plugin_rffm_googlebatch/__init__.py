"""Snakemake executor plugin `rffm-googlebatch`: upstream googlebatch 0.5.1, hardened for rffm.

Snakemake finds executor plugins by module name (`snakemake_executor_plugin_<name>` on sys.path),
so installing the rffm package registers `--executor rffm-googlebatch` and its
`--rffm-googlebatch-*` settings. What it changes and why: executor.py.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from snakemake_executor_plugin_googlebatch import ExecutorSettings as UpstreamSettings
from snakemake_executor_plugin_googlebatch import common_settings as upstream_common_settings

from .executor import Executor  # noqa: F401 (the plugin interface)


@dataclass
class ExecutorSettings(UpstreamSettings):
    """Upstream settings with safer defaults, plus the local-SSD scratch disk and VMs without external IP addresses."""

    # Optional[...], not X | None, and no postponed annotations: Snakemake calls the type to parse flags

    # every job runs in the digest-pinned container (COS); other families install unpinned software
    image_family: Optional[str] = field(  # noqa: UP045
        default="batch-cos-stable-official",
        metadata={"help": "Boot image family; must be a Batch COS family (container mode)", "env_var": False, "required": False},
    )
    image_project: Optional[str] = field(  # noqa: UP045
        default="batch-custom-image",
        metadata={"help": "Project of the boot image family", "env_var": False, "required": False},
    )
    # Batch-side retries; an application failure (exit 1) is never retried (lifecycle policy)
    retry_count: Optional[int] = field(  # noqa: UP045
        default=0,
        metadata={
            "help": "Batch retries after infrastructure failures (preemption, VM loss); default 0",
            "env_var": False,
            "required": False,
        },
    )
    max_run_duration: Optional[str] = field(  # noqa: UP045
        default="86400s",
        metadata={
            "help": "Maximum run time of one job, e.g. 86400s (upstream default 3600s kills training)",
            "env_var": False,
            "required": False,
        },
    )
    local_ssd_gb: Optional[int] = field(  # noqa: UP045
        default=0,
        metadata={
            "help": "Local SSD (multiple of 375 GB) attached to each job and mounted in the container at the "
            "hidden-state cache directory; 0: none. Per rule: resource googlebatch_local_ssd_gb",
            "env_var": False,
            "required": False,
        },
    )
    no_external_ip_address: bool = field(
        default=False,
        metadata={
            "help": "VMs get no external IP address (the subnetwork needs Private Google Access or Cloud NAT to reach Google APIs "
            "and the registry); with rffm-googlebatch-network / -subnetwork it forms the job's network interface",
            "env_var": False,
            "required": False,
        },
    )
    scratch_dir: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata={
            "help": "Workflow-relative cache directory the local SSD is mounted at (default: the workflow config's `scratch`)",
            "env_var": False,
            "required": False,
        },
    )


# The worker image carries the GCS storage plugin at a pinned version, so nothing is pip-installed
# on the VM (upstream pip-installs it on every job, which needs PyPI egress and is unpinned).
common_settings = dataclasses.replace(upstream_common_settings, auto_deploy_default_storage_provider=False)
