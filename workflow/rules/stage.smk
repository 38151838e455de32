from rffm.runtime.inputs import source_root


rule stage_dataset:
    input:
        source=dataset_source_files,
    output:
        splits=expand(dataset_file("{{dataset}}", "{split}.h5"), split=SPLITS),
        provenance=dataset_file("{dataset}", layout.PROVENANCE_NAME),
        sentinel=dataset_file("{dataset}", layout.SENTINEL_NAME),
    log:
        log_path("stage_dataset", "{dataset}"),
    params:
        spec=dataset_spec,
        code=CODE["stage_dataset"],
        out_dir=output_dir("sentinel"),
        source_root=lambda wildcards, input: source_root(
            input.source, dataset_source_files(wildcards)
        ),
    shell:
        "rffm stage_dataset --spec {params.spec:q} --source-root {params.source_root:q}"
        " --out-dir {params.out_dir} > {log} 2>&1"
