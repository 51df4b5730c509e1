"""`ember bench`: the seeds' platform comparison (Spark MLlib, and every ember strategy) on this
machine and, with --hosts and --link, on emulated links (TorchDistributor too), with a report and
plots.

`results.jsonl` holds one record per row and repetition. Its fields (None where a figure does not
apply or was not measured):

    kind            "row"
    task            "lr" | "mlp" | "lenet"
    row             the label in tables and plots: "mllib", a strategy, or "easgd-async tau=4"
    system          "ember" | "mllib" | "torch" (TorchDistributor, on emulated links)
    strategy        an ember strategy, or None for mllib and torch
    engine          "local" | "spark" (ember), "mllib", "torch"
    link, hosts     the emulated link's rate and worker hosts (rows on links), else None
    link_bytes_per_second  what a timed TCP transfer measured on that link (rows on links)
    link_latency_seconds   half the median TCP round trip to host 0 on that link (rows on links)
    workers         worker processes (mllib: Spark task slots)
    tau             easgd's communication period, else None
    sweep           True for the rows of the tau sweep
    repeat          0-based repetition
    status          "ok" | "failed"
    error           one-line error of a failed row, else None
    target_metric   "test_accuracy" (higher is better) | "test_loss" (lower is better)
    target_value    the value a row must reach
    data            the dataset's name, e.g. "mnist", "digits", "synthetic-lr"
    train_samples, test_samples, features   the sizes of the data as loaded for the row
    epochs          passes over the training data (ember), else None
    iterations      MLlib's optimizer iterations (mllib), else None
    time_to_target  training seconds until the target was first met, None if never
    samples_to_target  training samples (all workers) until then, None if never
    test_accuracy, test_loss       after training
    samples         training samples processed (all workers)
    train_seconds   the training itself: ember's worker loops, MLlib's fit calls
    wall_seconds    the whole row: process start, data loading, training, evaluation
    samples_per_second, seconds_per_epoch
    cpu_mean_percent, cpu_peak_percent   of all cores, over the row's whole process tree
    peak_memory_mb  the process tree's largest summed RSS
    bytes_per_sample  bytes pushed + pulled per training sample (None for mllib)
    t_comp_seconds, t_comm_seconds     summed over workers (None for mllib)
    curve           [[training seconds, samples, target metric], ...] in time order
    divergence      samples_to_target / single's samples_to_target in the same repetition
    predicted_samples_per_second, prediction_error  ember_lab.perfmodel's figure and
                    (predicted - measured) / measured
    predicted_time_to_target, time_to_target_error  d * single's samples to target at the
                    predicted samples/s, and its error against time_to_target
    config          the resolved configuration of the row
    ember_version

imports: emulated, perfmodel, plan; and ember's public names
"""
