"""Data-parallel MNIST training with hvdlite (the four Horovod lines are marked "hvdlite:").

    python examples/make_mnist_idx.py --out data/mnist          # or use the real MNIST files
    python -m hvdlite.runner.local -np 2 -- python examples/pytorch_mnist.py --data-dir data/mnist

Reads the standard IDX files (gzipped or not), shards the training set across ranks like DistributedSampler,
shows a progress bar on rank 0, averages metrics over ranks and lets rank 0 alone write the checkpoint.
"""

import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_idx  # noqa: E402

import hvdlite.torch as hvd  # noqa: E402


class MnistIdx(torch.utils.data.Dataset):
    def __init__(self, root, train=True):
        images, labels = mnist_idx.load_split(root, train)
        self.images, self.labels = torch.from_numpy(images), torch.from_numpy(labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index].unsqueeze(0), self.labels[index]


class ShardSampler(torch.utils.data.Sampler):
    """Each rank sees a disjoint, equally sized shard of a per-epoch shuffle (DistributedSampler's rule)."""

    def __init__(self, dataset_size, num_replicas, rank, shuffle=True, seed=0):
        self.size, self.replicas, self.rank, self.shuffle, self.seed = dataset_size, num_replicas, rank, shuffle, seed
        self.per_rank = math.ceil(dataset_size / num_replicas)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(
                self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch)
            ).tolist()
        else:
            order = list(range(self.size))
        order += order[: self.per_rank * self.replicas - len(order)]  # pad so every rank gets as many
        return iter(order[self.rank :: self.replicas])

    def __len__(self):
        return self.per_rank


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def averaged(value, name):
    return hvd.allreduce(torch.tensor(float(value)), name=name, op=hvd.Average).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="data/mnist")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--checkpoint", default="checkpoints/mnist.pt")
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    hvd.init()  # hvdlite: 1. start
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # hvdlite: 2. one core per rank
    train_set, test_set = MnistIdx(args.data_dir, train=True), MnistIdx(args.data_dir, train=False)
    sampler = ShardSampler(len(train_set), hvd.size(), hvd.rank(), seed=args.seed)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    test_sampler = ShardSampler(len(test_set), hvd.size(), hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),  # hvdlite: 3.
        compression=compression,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # hvdlite: 4. same start everywhere
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(1, args.epochs + 1):
        model.train()
        sampler.set_epoch(epoch)
        progress = tqdm(train_loader, desc=f"epoch {epoch}", disable=hvd.rank() != 0)
        running = 0.0
        for step, (images, labels) in enumerate(progress, 1):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            running += loss.item()
            progress.set_postfix(loss=f"{running / step:.3f}")
        train_loss = averaged(running / max(1, len(train_loader)), "metric.train_loss")

        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in test_loader:
                correct += (model(images).argmax(1) == labels).sum().item()
                total += len(labels)
        accuracy = averaged(correct / max(1, total), "metric.accuracy")
        if hvd.rank() == 0:
            print(
                f"epoch {epoch}: train loss {train_loss:.4f}, test accuracy {accuracy:.2%} "
                f"(averaged over {hvd.size()} ranks)",
                flush=True,
            )

    if hvd.rank() == 0:
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epochs": args.epochs}, args.checkpoint
        )
        print(f"checkpoint written to {args.checkpoint}")


if __name__ == "__main__":
    main()
