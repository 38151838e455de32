rule select_checkpoint:
    input:
        unpack(selection_inputs),
    output:
        selection=selection_file("{run}", layout.SELECTION_NAME),
        model_card=selection_file("{run}", layout.MODEL_CARD),
        provenance=selection_file("{run}", layout.PROVENANCE_NAME),
        sentinel=selection_file("{run}", layout.SENTINEL_NAME),
    log:
        log_path("select_checkpoint", "{run}"),
    resources:
        store=STORE,
    params:
        spec=run_spec,
        code=CODE["select_checkpoint"],
        epoch_dirs=input_dirs("epochs"),
        out_dir=output_dir("sentinel"),
    shell:
        "rffm select_checkpoint --spec {params.spec:q} --epoch-dirs {params.epoch_dirs}"
        " --store {resources.store} --out-dir {params.out_dir} > {log} 2>&1"
