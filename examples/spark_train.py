"""Train a small PyTorch model on Spark with hvdlite (Horovod's horovod.spark.run API).

    python examples/spark_train.py                          # a local Spark (local[*]: one rank per core)
    python examples/spark_train.py --master local-cluster[2,1,1024] --num-proc 2
    spark-submit --master spark://HOST:7077 examples/spark_train.py --num-proc 4

The data, a noisy linear function, is generated here (nothing is downloaded) and handed to every rank with the
function, so the executors need no shared filesystem; each rank trains on its own shard, gradients averaged by
hvdlite. Prints each epoch's loss averaged over the ranks and the learned weights, which every rank holds
identically. The executors need hvdlite and torch installed in the Python Spark runs them with (PYSPARK_PYTHON).
"""

import argparse
import os
import sys

import numpy as np

TRUE_WEIGHTS = [2.0, -3.0, 0.5]
TRUE_BIAS = 1.0


def make_dataset(rows, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, len(TRUE_WEIGHTS))).astype(np.float32)
    y = (x @ np.array(TRUE_WEIGHTS, dtype=np.float32) + TRUE_BIAS + 0.01 * rng.normal(size=rows)).astype(np.float32)
    return x, y[:, None]


def train(x, y, epochs, batch_size, lr):
    """Runs on every rank, in a Spark task: a plain PyTorch loop plus hvdlite's four lines."""
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())  # different on purpose: broadcast_parameters makes the models equal
    features = torch.from_numpy(x[hvd.rank() :: hvd.size()])
    targets = torch.from_numpy(y[hvd.rank() :: hvd.size()])

    model = torch.nn.Linear(features.shape[1], 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr * hvd.size()), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    losses = []
    steps = len(features) // batch_size  # the same on every rank: shards differ by at most one row
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
        if hvd.rank() == 0:
            print(f"epoch {epoch} done", flush=True)  # reaches the driver as "[0]<stdout>: epoch 0 done"
    weights = torch.cat([model.weight.detach().flatten(), model.bias.detach()]).tolist()
    return {"rank": hvd.rank(), "losses": losses, "weights": weights}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    parser.add_argument("--num-proc", type=int, help="ranks (default: spark.default.parallelism)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    # Executors on this machine run this very Python (with hvdlite and torch); a real cluster sets its own.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import hvdlite.spark

    builder = SparkSession.builder.appName("hvdlite-spark-train").config("spark.ui.showConsoleProgress", "false")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        x, y = make_dataset(args.rows)
        results = hvdlite.spark.run(train, args=(x, y, args.epochs, args.batch_size, args.lr), num_proc=args.num_proc)
    finally:
        spark.stop()
    for epoch, loss in enumerate(results[0]["losses"]):
        print(f"epoch {epoch}: loss {loss:.5f}")
    weights = results[0]["weights"]
    print("learned weights", " ".join(f"{w:.3f}" for w in weights), "| true", TRUE_WEIGHTS, TRUE_BIAS)
    assert all(r["weights"] == weights for r in results), "ranks disagree on the model"


if __name__ == "__main__":
    main()
