# The qualified classifier as one deployable program (torch.export .pt2, ONNX, safetensors, model card),
# checked against rffm's own evaluation on the validation split. It reads the qualification's sentinel
# (the test result it reports), never the test split.


rule export:
    input:
        unpack(export_inputs),
    output:
        program=run_file("{run}", "export/model.pt2"),
        onnx=run_file("{run}", "export/model.onnx"),
        weights=run_file("{run}", "export/weights.safetensors"),
        model_card=run_file("{run}", "export/model_card.json"),
        provenance=run_file("{run}", "export/provenance.json"),
        sentinel=run_file("{run}", "export/sentinel.json"),
    log:
        f"{RESULTS}/logs/export/{{run}}.log",
    threads: THREADS
    resources:
        store=STORE,
        torch_threads=THREADS,  # the config's, never capped by --cores (which caps threads:)
    params:
        spec=run_spec,
        code=CODE["export"],
        dirs=export_dirs,
        out_dir=output_dir("sentinel"),
    shell:
        "rffm export --spec {params.spec:q} --threads {resources.torch_threads}"
        " --qualification-dir {params.dirs[qualification]} --selection-dir {params.dirs[selection]}"
        " --dataset-dir {params.dirs[dataset]} --backbone-dir {params.dirs[backbone]}"
        " --cache-record-dir {params.dirs[cache]}"
        " --store {resources.store} --out-dir {params.out_dir} > {log} 2>&1"
