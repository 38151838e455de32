rule select_checkpoint:
    input:
        unpack(selection_inputs),
    output:
        selection=selection_file("{run}", "selection.json"),
        model_card=selection_file("{run}", "model_card.json"),
        provenance=selection_file("{run}", "provenance.json"),
        sentinel=selection_file("{run}", "sentinel.json"),
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
