"""Elastic MNIST training: the job goes on when workers are lost and takes in workers that are added.

    python examples/make_mnist_idx.py --out data/mnist
    printf '#!/bin/sh\\necho localhost:2\\n' > discover.sh && chmod +x discover.sh   # your hosts, one per line
    hvdlite-run -np 2 --min-np 1 --max-np 2 --host-discovery-script ./discover.sh \\
        python examples/pytorch_elastic.py --data-dir data/mnist

What makes it elastic (marked "elastic:"): the training loop is a function decorated with hvd.elastic.run that
takes a TorchState (model, optimizer, sampler and the loop counters); state.commit() after every few batches
marks a point to roll back to. When a worker dies, the others' collectives fail, they roll back to the last
commit and hvdlite-run re-forms the job without it; when the discovery script reports a new slot, a worker
starts there and joins at the next commit. The ElasticSampler splits what is left of the epoch among whoever
is there, so no sample is skipped or seen twice in an epoch. The learning rate follows the number of workers.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

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


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 5)
        self.fc1 = nn.Linear(16 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="data/mnist")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batches-per-commit", type=int, default=5)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)
    train_set, test_set = MnistIdx(args.data_dir, train=True), MnistIdx(args.data_dir, train=False)
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=42)  # elastic: 1.
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = Net()
    base = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())

    def on_reset():  # elastic: 2.
        sampler.reset()
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        if hvd.rank() == 0:
            print(f"re-formed: {hvd.size()} worker(s)", flush=True)

    @hvd.elastic.run  # elastic: 3.
    def train(state):
        while state.epoch < args.epochs:
            model.train()
            for batch_idx, (images, labels) in enumerate(train_loader):
                optimizer.zero_grad()
                F.cross_entropy(model(images), labels).backward()
                optimizer.step()
                sampler.record_batch(batch_idx, args.batch_size)
                if batch_idx % args.batches_per_commit == 0:
                    state.commit()  # elastic: 4.
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch} done on {hvd.size()} worker(s)", flush=True)

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)  # elastic: 5.
    state.register_reset_callbacks([on_reset])
    train(state)

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(test_set, batch_size=256):
            correct += (model(images).argmax(1) == labels).sum().item()
            total += len(labels)
    if hvd.rank() == 0:
        print(f"test accuracy {correct / total:.2%} after {args.epochs} epoch(s)", flush=True)


if __name__ == "__main__":
    main()
