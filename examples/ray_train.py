"""Train a small PyTorch model on a Ray cluster with hvdlite's RayExecutor (Horovod's horovod.ray API).

    python examples/ray_train.py                         # starts a local Ray with 2 CPUs
    python examples/ray_train.py --address HOST:6379     # an existing cluster (`ray start --head`)

The data is a CSV file of a noisy linear function, written here so nothing is downloaded; each worker reads
the file and trains on its own shard, gradients averaged by hvdlite. Prints each epoch's loss averaged over
the workers and the learned weights, which every worker holds identically.
"""

import argparse
import csv
import os
import tempfile

import numpy as np
import ray

from hvdlite.ray import RayExecutor

TRUE_WEIGHTS = [2.0, -3.0, 0.5]
TRUE_BIAS = 1.0


def write_dataset(path, rows, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, len(TRUE_WEIGHTS)))
    y = x @ np.array(TRUE_WEIGHTS) + TRUE_BIAS + 0.01 * rng.normal(size=rows)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f"x{i}" for i in range(x.shape[1])] + ["y"])
        writer.writerows(np.column_stack([x, y]).tolist())


def train(data_path, epochs, batch_size, lr):
    """Runs on every worker: a plain PyTorch loop plus hvdlite's four lines."""
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())  # different on purpose: broadcast_parameters makes the models equal
    table = np.loadtxt(data_path, delimiter=",", skiprows=1, dtype=np.float32)
    shard = torch.from_numpy(table[hvd.rank() :: hvd.size()])
    features, targets = shard[:, :-1], shard[:, -1:]

    model = torch.nn.Linear(features.shape[1], 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr * hvd.size()), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    losses = []
    steps = len(features) // batch_size  # the same on every worker: shards differ by at most one row
    for epoch in range(epochs):
        total = 0.0
        for step in range(steps):
            batch = slice(step * batch_size, (step + 1) * batch_size)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(features[batch]), targets[batch])
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(hvd.allreduce(torch.tensor(total / steps), name=f"loss.{epoch}").item())
    weights = torch.cat([model.weight.detach().flatten(), model.bias.detach()]).tolist()
    return {"rank": hvd.rank(), "losses": losses, "weights": weights}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", help="Ray cluster to join (default: start a local one)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_workers, include_dashboard=False, object_store_memory=100 * 2**20)
    with tempfile.TemporaryDirectory() as folder:
        data_path = os.path.join(folder, "linear.csv")
        write_dataset(data_path, args.rows)
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=args.num_workers)
        executor.start()
        try:
            results = executor.run(train, args=[data_path, args.epochs, args.batch_size, args.lr])
        finally:
            executor.shutdown()
    for epoch, loss in enumerate(results[0]["losses"]):
        print(f"epoch {epoch}: loss {loss:.5f}")
    weights = results[0]["weights"]
    print("learned weights", " ".join(f"{w:.3f}" for w in weights), "| true", TRUE_WEIGHTS, TRUE_BIAS)
    assert all(r["weights"] == weights for r in results), "workers disagree on the model"


if __name__ == "__main__":
    main()
