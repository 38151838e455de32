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
    threads: config["epoch_threads"]
    resources:
        device=DEVICE,
        epoch_profile_batches=epoch_profile_batches,
    params:
        spec=epoch_spec,
        code=CODE["train_epoch"],
        cache_dir=input_dir("cache"),
        previous=previous_epoch_arg,
        profile_dir=profile_dir,
        out_dir=output_dir("sentinel"),
    shell:
        "rffm train_epoch --spec {params.spec:q} --threads {threads} --epoch {wildcards.epoch}"
        " --cache-dir {params.cache_dir} {params.previous} --device {resources.device}"
        " --profile-dir {params.profile_dir}"
        " --profile-batches {resources.epoch_profile_batches} --out-dir {params.out_dir} > {log} 2>&1"
