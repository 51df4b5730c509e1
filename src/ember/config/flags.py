"""What each `ember train` flag sets: one line of help per RunConfig field, kept apart from
the parser so cli.py stays about parsing; and the argparse type of a count."""

import argparse
import re

HELP = {
    # One line per RunConfig field: what it sets, its unit, and what leaving it unset means.
    "data": "mnist | digits | synthetic-lr | path to a .npz file, a .parquet file or folder, or an"
    " MNIST IDX folder (their layouts: docs/data.md)",
    "model": "mlp | logreg | lenet | cnn_bn | package.module:factory, a function returning a"
    " torch.nn.Module, imported from the working directory, then PYTHONPATH and site-packages",
    "strategy": "single | bsp | ssp | async | easgd | easgd-async | allreduce | diloco",
    "workers": "data-parallel worker processes (Spark: barrier tasks), each on its own shard;"
    " MIN:MAX, a range whose members join and leave while the run goes on",
    "workers_max": "a worker range's MAX (--workers MIN:MAX says both)",
    "servers": "parameter-server processes; the flat parameter vector is split into this many"
    " key ranges",
    "epochs": "passes over the training set; each worker passes over its 1/workers shard",
    "batch_size": "examples per minibatch, per worker (one step trains workers x this)",
    "lr": "learning rate of the servers' optimizer (bsp, ssp, async) or of each worker's local"
    " optimizer (easgd, easgd-async, diloco's inner steps, single, allreduce)",
    "momentum": "SGD momentum in [0, 1), on the servers (bsp, ssp, async) or local (the others)",
    "nesterov": "Nesterov momentum in the local optimizer (EAMSGD with easgd); needs"
    " --momentum > 0",
    "optimizer": "sgd (momentum SGD, the default) | adam | adamw, on the servers (bsp, ssp,"
    " async: state kept per shard, replicated and checkpointed) or on each worker (single,"
    " easgd, easgd-async, allreduce: also rmsprop, adagrad or any torch.optim class name)",
    "weight_decay": "weight decay: an L2 term in the gradient (sgd, adam) or decoupled (adamw)",
    "scheduler": "constant | step (x0.1 at each third) | cosine (to 0) | onecycle | linear (to"
    " 0): the learning rate over the run's optimizer steps; a server's advance with its clock",
    "warmup_steps": "optimizer steps over which the learning rate rises linearly to --lr",
    "precision": "32 | bf16-mixed | 16-mixed: the forward pass in float32, or under autocast to"
    " bfloat16 or float16 (16-mixed with a gradient scaler) with float32 parameters, gradients,"
    " exchanges and servers (docs/gpu.md)",
    "device": "auto | cpu | cuda | cuda:N: where workers compute; auto takes a GPU where torch"
    " sees one (local: worker i on GPU i mod the GPUs; Spark: the GPU the task was assigned),"
    " else the CPU (docs/gpu.md)",
    "loss": "cross_entropy (class indices) | mse | l1 | huber (float targets) | bce_with_logits"
    " | package.module:function taking (output, target) (docs/training.md)",
    "metrics": "comma-separated held-out metrics: accuracy, rmse, mae, r2 or"
    " package.module:function (default: accuracy for classes, rmse,r2 for values)",
    "optimizer_args": "the optimizer's keyword arguments as a JSON object, e.g."
    ' \'{"betas": [0.9, 0.95], "eps": 1e-8}\'',
    "data_mode": "auto | memory | stream: hold each worker's shard in memory, or stream it from"
    " disk in batches (auto streams data too large for memory; docs/data.md)",
    "shuffle_buffer": "stream: rows mixed in each worker's bounded shuffle buffer",
    "clip_grad_norm": "clip each worker's gradient to this L2 norm before it is used or sent",
    "tau": "easgd, easgd-async, diloco: local steps (minibatches) between a worker's exchanges"
    " with the center (diloco: its pushes of a pseudo-gradient; unset, 200 for diloco); each"
    " worker also exchanges once when it finishes. easgd-async also takes auto (the period"
    " the throughput model picks from the exchange and step times it measures) or loss"
    " (exchange once the training loss summed since the last exchange passes the first"
    " period's), starting from the default tau (docs/tau.md)",
    "tau_policy": "fixed | auto | loss, as --tau auto and --tau loss set it; with it --tau is"
    " the starting period",
    "alpha": "easgd, easgd-async: moving rate in (0, 1] of an exchange, e = alpha * (x_i -"
    " center); unset: 0.9 / workers (the paper's beta / p)",
    "outer_lr": "diloco: learning rate of the servers' outer Nesterov SGD step over the round's"
    " mean pseudo-gradient (start minus end of the period); 1 with --outer-momentum 0 is"
    " parameter averaging every tau steps (docs/diloco.md)",
    "outer_momentum": "diloco: Nesterov momentum in [0, 1) of the outer step; its buffer is kept"
    " per shard on the servers, replicated and checkpointed with the parameters",
    "fragments": "diloco: split the parameters into this many fragments, each synced every tau"
    " steps, tau / fragments steps after the one before, on a background exchanger while the"
    " worker computes (Streaming DiLoCo); fragment f is the keys of servers / fragments"
    " servers, so it must divide --servers and --tau (docs/diloco.md)",
    "fragment_sync_delay": "diloco --fragments: local steps from a fragment's push to the merge"
    " of its result, in [0, tau / fragments]: below tau / fragments the n-th sync is pushed"
    " after step n * tau / fragments minus these steps and merged after step n * tau /"
    " fragments, as torchft's fragment_sync_delay (0: the worker waits for each sync); unset:"
    " tau / fragments, pushed after step n * tau / fragments and merged a stagger later, the"
    " most compute overlapping each sync (docs/diloco.md)",
    "mixing_alpha": "diloco: in [0, 1], where a worker goes on from after a round: alpha x_local"
    " + (1 - alpha) x_global, torchft's mixing (its fragment_update_alpha), x_local being its"
    " parameters when the result is merged; 0 takes the global parameters and drops the steps"
    " a fragment's sync overlapped, 1 keeps the local ones; unset: the global parameters plus"
    " those overlapped steps, ember's own rule (docs/diloco.md)",
    "staleness": "ssp: clocks (pushes) a worker may run ahead of the slowest before it waits",
    "n_push": "bsp, ssp, async: steps whose gradients a worker averages into one push; the"
    " remaining ones are pushed when it finishes",
    "n_fetch": "bsp, ssp, async: steps between a worker's pulls of the current parameters",
    "compress": "none | fp16 | bf16 | int8: how bsp, ssp, async, easgd and diloco exchanges"
    " travel;"
    " int8 is 8-bit with a scale per 4096 values, with error feedback (docs/compression.md)",
    "engine": "local (processes on this machine) | spark (barrier tasks on --master)",
    "master": "--engine spark: Spark master URL, e.g. local[4], spark://host:7077, yarn or"
    " k8s://https://host:443; unset: local[WORKERS]",
    "bind_address": "host or IPv4 address the parameter servers (and the Spark record collector)"
    " listen on; unset: 127.0.0.1, or on a cluster master spark.driver.bindAddress, else 0.0.0.0",
    "advertise_address": "host or IPv4 address workers connect to the servers at; unset:"
    " 127.0.0.1, or on a cluster master spark.driver.host",
    "ports": "LO-HI: every port the run listens on (server processes, their replicas, the Spark"
    " record collector) is taken from this range, for firewalls; unset: any free port",
    "out": "run directory for summary.json, metrics.jsonl and checkpoints/; unset:"
    " runs/<timestamp>-<strategy>-<pid>",
    "resume": "auto (the newest valid checkpoint in --out) or a checkpoint path, continuing with"
    " the settings saved there (flags may change --epochs and the few docs/running.md lists);"
    " unset: start from the initial model",
    "seed": "seeds model initialization, data shuffling and synthetic data",
    "threads": "PyTorch threads per worker process",
    "synthetic_samples": "--data synthetic-lr: training rows (plus max(1000, rows / 10) test rows)",
    "synthetic_features": "--data synthetic-lr: feature columns",
    "checkpoint_seconds": "seconds between checkpoints, at most",
    "checkpoint_steps": "also checkpoint every this many server steps; 0: by time only",
    "keep_checkpoints": "checkpoints kept besides `last`; older ones are deleted",
    "replicas": "server processes per shard: 1, or 2 for a backup that takes over when its"
    " primary dies",
    "replica_seconds": "seconds a backup lags its primary at most (how often it gets a copy)",
    "max_restarts": "times each dead worker or server process is restarted before the run fails",
    "worker_timeout": "seconds of silence after which a worker is dropped, so synchronous peers"
    " stop waiting for it",
    "max_workers": "workers each parameter server registers at once (the run's own and those"
    " `ember join` adds; joined ones leave when they finish or fall silent), at least --workers;"
    " unset: 4 x workers + 1024",
    "request_timeout": "seconds to wait for a server's answer before failing; must exceed"
    " --worker-timeout",
    "encrypt": "ZeroMQ CURVE on every connection: only the run's processes get in and nothing"
    " travels in clear; off: plain TCP, for a trusted network (it warns when a server is"
    " reachable beyond this host)",
    "wire_cipher": "what encrypts the connections under --encrypt: curve (ZeroMQ CURVE, every"
    " frame) or aead (the HMAC handshake, then AES-GCM or ChaCha20 on the payloads alone;"
    " headers readable, see docs/hardening.md)",
    "wire_lanes": "sockets (each with its own I/O thread) a worker's connection to a shard"
    " stripes its payloads over when it does not share memory with it: auto (a probe at"
    " connect picks 1, 2 or 4, see docs/wire.md) or 1 to 8",
    "log_every": "steps between a worker's records (loss, samples/s, T_comp, T_comm) in"
    " metrics.jsonl",
    "eval_every": "steps between worker 0's test-set evaluations; 0: only at each epoch's end",
    "eval_deferred": "worker 0 copies the parameters at each evaluation point and evaluates the"
    " copies after training, so evaluating never pauses the run (the Spark engine then ships"
    " the whole test set to the tasks); off: it evaluates on the spot",
    "tensorboard": "also write the metrics as TensorBoard event files, in OUT/tensorboard",
    "report": "draw OUT/report.png at the end: loss, held-out figures and learning rate"
    " (matplotlib; `ember report OUT` draws any run's)",
    "mlflow": "log the run to one MLflow run at MLFLOW_TRACKING_URI: its fields, worker 0's"
    " evaluation at each epoch's end, the summary's figures, its files and the model"
    " (docs/spark.md#tracking-with-mlflow)",
}


def positive_int(text: str) -> int:
    """An argparse type for counts: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


# A flag's value worth carrying into a keyword: a number, a PLACEHOLDER, or one of these words
_VALUES = {"auto", "cpu", "off", "on", "loss", "fixed", "local", "spark"}
_FLAG = re.compile(r"--([a-z][a-z0-9-]*)(?: ([0-9][0-9.]*|[A-Z]+|[a-z][a-z-]*))?")


def in_python_terms(text: str) -> str:
    """An error's words for a caller of the Python API: `--tau auto` as `tau="auto"`,
    `--fragments 1` as `fragments=1`, `--resume PATH` as `resume=PATH`, a bare `--out` as
    `out=` (config's messages name flags, as `ember train` takes them)."""

    def keyword(flag: re.Match[str]) -> str:
        name, value = flag[1].replace("-", "_"), flag[2]
        if value is None or not (value[0].isdigit() or value.isupper() or _is_word(value)):
            return f"{name}=" + (f" {value}" if value is not None else "")
        return f'{name}="{value}"' if _is_word(value) else f"{name}={value}"

    return _FLAG.sub(keyword, text)


def _is_word(value: str) -> bool:
    from ember.config.strategies import STRATEGIES

    return value in _VALUES or value in STRATEGIES
