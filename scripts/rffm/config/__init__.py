"""The workflow configuration: checked against the schema, with one readable line per problem, and
completed with the schema's defaults (the only place defaults live).

One validator (`validate`), in three passes, each problem one line `dotted.key: what is wrong. Fix: how`:
1. the files as written (`files`: keys given twice), every number finite, the schema (`messages`);
2. once the shape is right (`rules`): cross-references and constraints between fields (splits, SNR ranges,
   attention heads, patch vs signal length), and paths that would resolve to the filesystem root;
3. where the caller says so (`invocation` reads it from Snakemake), the machine (`host`): results/scratch
   usable, imported files present, the GPU there.
Nothing is ever written while checking. `defaults` fills the schema's defaults in; `schema` loads and walks it.

This face re-exports the entry points callers use (`from rffm.config import load`).
"""

from rffm.config.defaults import entry_defaults, fill_defaults
from rffm.config.files import duplicate_keys, file_problems, merge, read
from rffm.config.invocation import check_default_file, snakemake_settings, typed_overrides, where_jobs_run
from rffm.config.schema import SCHEMA, load_schema
from rffm.config.validate import check, for_results, load, problems

__all__ = [
    "SCHEMA",
    "check",
    "check_default_file",
    "duplicate_keys",
    "entry_defaults",
    "file_problems",
    "fill_defaults",
    "for_results",
    "load",
    "load_schema",
    "merge",
    "problems",
    "read",
    "snakemake_settings",
    "typed_overrides",
    "where_jobs_run",
]
