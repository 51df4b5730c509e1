"""apache/spark python/test_support/test_pytorch_training_file.py, the script file that
TorchDistributor.run("...py", "0.01") runs on every process: a DDP gloo CNN on MNIST. As in
tests/peers/mnist_ddp.py, MNIST is read from ember's copy rather than downloaded, and a second
argument takes the first ROWS rows (the peer's file trains 3 epochs on all 60,000)."""

batch_size = 100
num_epochs = 3
momentum = 0.5
log_interval = 100

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.optim as optim  # noqa: E402

from tests.peers.mnist_ddp import MNIST, Net  # noqa: E402


def train_one_epoch(model, data_loader, optimizer, epoch):  # type: ignore[no-untyped-def]
    model.train()
    for batch_idx, (data, target) in enumerate(data_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % log_interval == 0:
            print(
                "Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(  # noqa: UP032 (the peer's)
                    epoch,
                    batch_idx * len(data),
                    len(data_loader) * len(data),
                    100.0 * batch_idx / len(data_loader),
                    loss.item(),
                )
            )


def train(learning_rate, rows):  # type: ignore[no-untyped-def]
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    print("Running distributed training")
    dist.init_process_group("gloo")

    train_dataset = MNIST(rows=rows)

    train_sampler = DistributedSampler(dataset=train_dataset)
    data_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=batch_size, sampler=train_sampler
    )

    model = Net()
    ddp_model = DDP(model)

    optimizer = optim.SGD(ddp_model.parameters(), lr=learning_rate, momentum=momentum)
    for epoch in range(1, num_epochs + 1):
        train_one_epoch(ddp_model, data_loader, optimizer, epoch)

    dist.destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("lr", help="learning_rate", default=0.001)
    parser.add_argument("rows", type=int, nargs="?", default=None)
    args = parser.parse_args()
    print("learning rate chosen: ", float(args.lr))
    train(float(args.lr), args.rows)
