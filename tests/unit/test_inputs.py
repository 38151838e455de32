"""Where a rule's configured input files are on the machine that runs it."""

from rffm.runtime.inputs import source_root


def test_local_inputs_are_where_the_config_says():
    assert source_root(["data/mine.h5"], ["data/mine.h5"]) == "."
    assert source_root("models/backbone.pt", ["models/backbone.pt"]) == "."
    assert source_root([], []) == "."


def test_a_storage_providers_copy_names_its_folder():
    local = ".snakemake/storage/rffm-gcs/my-bucket/rffm/data/mine.h5"
    assert source_root([local], ["data/mine.h5"]) == ".snakemake/storage/rffm-gcs/my-bucket/rffm/"
    # a file that merely ends with the same name is not taken for it
    assert source_root(["other-data/mine.h5"], ["data/mine.h5"]) == "."
