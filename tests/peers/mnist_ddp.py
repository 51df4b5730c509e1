"""TorchDistributor's end-to-end training function (apache/spark
python/pyspark/ml/torch/tests/test_distributor.py, `create_training_function`), as a user of
TorchDistributor has it: a DDP gloo CNN on MNIST, returning "success". Only the dataset differs:
torchvision's datasets.MNIST downloads its files, and here they are read from the copy ember
ships, with the same transform (ToTensor, then Normalize((0.1307,), (0.3081,)))."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember.data
from ember.data.idx import load_idx_folder

MNIST_FILES = Path(ember.data.__file__).parent / "mnist"


class MNIST(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """torchvision.datasets.MNIST(train=True) with ToTensor and Normalize: uint8 images kept,
    each item scaled when read, as torchvision's transform does; `rows` takes the first ones."""

    def __init__(self, folder: Path = MNIST_FILES, rows: int | None = None) -> None:
        arrays = load_idx_folder(folder)
        self.images = np.array(arrays["x_train"][:rows])
        self.labels = np.array(arrays["y_train"][:rows], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.from_numpy(self.images[index]).float().div(255).unsqueeze(0)
        return (image - 0.1307) / 0.3081, int(self.labels[index])


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: Any) -> Any:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def create_training_function(rows: int | None = None) -> Callable[[float], Any]:
    """The peer's closure over its training set, which TorchDistributor cloudpickles to every
    process, as ember.run does."""
    batch_size = 100
    num_epochs = 1
    momentum = 0.5
    train_dataset = MNIST(rows=rows)

    def train_fn(learning_rate: float) -> Any:
        import torch
        import torch.distributed as dist
        import torch.optim as optim
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data.distributed import DistributedSampler

        dist.init_process_group("gloo")

        train_sampler = DistributedSampler(dataset=train_dataset)
        data_loader = torch.utils.data.DataLoader(
            train_dataset, batch_size=batch_size, sampler=train_sampler
        )

        model = Net()
        ddp_model = DDP(model)
        optimizer = optim.SGD(ddp_model.parameters(), lr=learning_rate, momentum=momentum)
        for epoch in range(1, num_epochs + 1):
            model.train()
            for _, (data, target) in enumerate(data_loader):
                optimizer.zero_grad()
                output = model(data)
                loss = F.nll_loss(output, target)
                loss.backward()
                optimizer.step()
            print(f"epoch {epoch} finished.")

        return "success"

    return train_fn
