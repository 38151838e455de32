rule select_checkpoint:
    input:
        unpack(selection_inputs),
    output:
        selection=run_file("{run}", "selection/selection.json"),
        model_card=run_file("{run}", "selection/model_card.json"),
        provenance=run_file("{run}", "selection/provenance.json"),
        sentinel=run_file("{run}", "selection/sentinel.json"),
    log:
        f"{RESULTS}/logs/select_checkpoint/{{run}}.log",
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
