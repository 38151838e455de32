rule train_epoch:
    input:
        unpack(epoch_inputs),
    output:
        checkpoint=epoch_file("{run}", "{epoch}", "checkpoint.pt"),
        metrics=epoch_file("{run}", "{epoch}", "metrics.json"),
        provenance=epoch_file("{run}", "{epoch}", "provenance.json"),
        sentinel=epoch_file("{run}", "{epoch}", "sentinel.json"),
    log:
        f"{RESULTS}/logs/train_epoch/{{run}}/{{epoch}}.log",
    conda:
        "../../envs/rffm.yaml"
    threads: config["epoch_threads"]
    params:
        spec=epoch_spec,
        code=CODE["train"],
        cache_dir=input_dir("cache"),
        previous=previous_epoch_arg,
        profiling=epoch_profiling_args,
        device=device_arg,
        out_dir=output_dir("sentinel"),
    shell:
        "rffm train-epoch --spec {params.spec:q} --threads {threads} --epoch {wildcards.epoch}"
        " --cache-dir {params.cache_dir} {params.previous} {params.profiling} {params.device}"
        " --out-dir {params.out_dir} > {log} 2>&1"
