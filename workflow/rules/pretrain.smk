rule pretrain_backbone:
    input:
        unpack(backbone_inputs),
    output:
        weights=backbone_file("{backbone}", layout.BACKBONE_NAME),
        log_json=backbone_file("{backbone}", layout.PRETRAIN_LOG),
        provenance=backbone_file("{backbone}", layout.PROVENANCE_NAME),
        sentinel=backbone_file("{backbone}", layout.SENTINEL_NAME),
    log:
        log_path("pretrain_backbone", "{backbone}"),
    wildcard_constraints:
        backbone=names_pattern(backbones_built_by("pretrain_backbone")),
    threads: THREADS
    resources:
        torch_threads=THREADS,  # the config's, never capped by --cores (which caps threads:)
        device=DEVICE,
    params:
        spec=backbone_spec,
        code=CODE["pretrain_backbone"],
        dataset_dir=input_dir("dataset"),
        out_dir=output_dir("sentinel"),
    shell:
        "rffm pretrain_backbone --spec {params.spec:q} --threads {resources.torch_threads} --device {resources.device}"
        " --dataset-dir {params.dataset_dir} --out-dir {params.out_dir} > {log} 2>&1"


rule import_backbone:
    input:
        checkpoint=imported_checkpoint,
    output:
        weights=backbone_file("{backbone}", layout.BACKBONE_NAME),
        log_json=backbone_file("{backbone}", layout.PRETRAIN_LOG),
        provenance=backbone_file("{backbone}", layout.PROVENANCE_NAME),
        sentinel=backbone_file("{backbone}", layout.SENTINEL_NAME),
    log:
        log_path("import_backbone", "{backbone}"),
    wildcard_constraints:
        backbone=names_pattern(backbones_built_by("import_backbone")),
    params:
        spec=backbone_spec,
        code=CODE["import_backbone"],
        user_code=user_code,
        out_dir=output_dir("sentinel"),
        source_root=lambda wildcards, input: source_root(
            input.checkpoint, [config["backbones"][wildcards.backbone]["path"]]
        ),
    shell:
        "rffm import_backbone --spec {params.spec:q} --source-root {params.source_root:q}"
        " --out-dir {params.out_dir} > {log} 2>&1"
