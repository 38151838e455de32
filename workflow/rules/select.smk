rule select_checkpoint:
    input:
        unpack(selection_inputs),
    output:
        selection=run_file("{run}", "selection/selection.json"),
        artifact=directory(run_file("{run}", "selection/artifact")),
        provenance=run_file("{run}", "selection/provenance.json"),
        sentinel=run_file("{run}", "selection/sentinel.json"),
    log:
        f"{RESULTS}/logs/select_checkpoint/{{run}}.log",
    params:
        spec=run_spec,
        code=CODE["select_checkpoint"],
        epoch_dirs=input_dirs("epochs"),
        out_dir=output_dir("sentinel"),
    shell:
        "rffm select_checkpoint --spec {params.spec:q} --epoch-dirs {params.epoch_dirs}"
        " --out-dir {params.out_dir} > {log} 2>&1"
