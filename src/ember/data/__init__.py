"""Training data: named datasets, user files (.npz, .parquet, MNIST IDX) and per-worker shards.

Dataset        dataset.py   train/test arrays (float32 features, int64 labels), classes and shape
load_dataset   datasets.py  mnist, digits, synthetic-lr or a .npz/.parquet/IDX path -> Dataset
shard_indices  dataset.py   the contiguous, equal-size rows worker `rank` of `world` trains on
DATASET_NAMES  datasets.py  the names load_dataset accepts besides paths
load_npz       files.py     a user's .npz (its own split, or x and y) checked -> Dataset
load_parquet   files.py     a user's Parquet file or folder (features, label) checked -> Dataset
read_idx       idx.py       one IDX file, gzipped or raw, checked and read into a NumPy array
cached_idx     cache.py     an IDX folder decoded once per machine into .npy files
DataFiles      store.py     a dataset as .npy files every process maps; a worker its shard alone
host_data      host.py      a run's one copy of its data on this host, laid out by the launcher
StreamPlan     stream.py    a dataset's rows as pieces on disk (row groups, .npy windows, .npz)
StreamBatches  streaming.py a shard streamed: seeded piece order, read-ahead, shuffle buffer
host_run_data  streamhost.py --data-mode on a local run: laid out to map, or planned to stream
generate       generate.py  `ember data generate`: synthetic Parquet sets, row group by group

imports: config, errors
"""

from ember.data.dataset import Dataset, shard_indices
from ember.data.datasets import DATASET_NAMES, load_dataset
from ember.data.idx import read_idx

__all__ = ["DATASET_NAMES", "Dataset", "load_dataset", "read_idx", "shard_indices"]
