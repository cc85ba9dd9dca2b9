"""hvdlite.tensorflow.keras (Keras 3) across real processes: model.fit and custom loops with DistributedOptimizer
against a single process on the global batch, callbacks, LossScaleOptimizer, saving and reloading, XLA and
mismatch errors, and the examples.

TensorFlow and Keras cost seconds to import per rank, so each test is ONE job running many checks (a module of
tests/jobs/ that imports keras_common); each job computes its reference itself.
"""

import os
import sys

import pytest
from multiproc import run_job, run_job_function

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(job, np, args=(), timeout=150):
    """Runs tests/jobs/<job>.py on np ranks; a failed assertion fails the test with the rank's explanation."""
    run_job_function(job, np, args=args, timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.mark.timeout(240)
@pytest.mark.parametrize("np", [2, 3])
def test_fit_matches_single_process_with_callbacks(np):
    run("keras_fit", np=np)


@pytest.mark.timeout(240)
def test_custom_loops_accumulation_slow_link_methods_loss_scaling_and_sync_batch_norm():
    run("keras_custom_loops", np=2)


@pytest.mark.timeout(240)
def test_horovod_options_on_keras3_variables():
    run("keras_horovod_options", np=2)


@pytest.mark.timeout(240)
def test_save_reload_learning_rate_callbacks_and_errors(tmp_path):
    path = str(tmp_path / "model.keras")
    run("keras_save_reload", np=2, args=[path])


@pytest.mark.timeout(300)
def test_examples_keras_mnist_and_synthetic_benchmark(tmp_path):
    import subprocess

    data = tmp_path / "mnist"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "make_mnist_idx.py"),
            "--out",
            str(data),
            "--train",
            "1200",
            "--test",
            "400",
        ],
        check=True,
    )
    checkpoint = tmp_path / "ckpt" / "mnist.keras"
    script = f"""
import runpy, sys
sys.argv = ["keras_mnist.py", "--data-dir", {str(data)!r}, "--epochs", "2", "--checkpoint", {str(checkpoint)!r}]
runpy.run_path({os.path.join(ROOT, "examples", "keras_mnist.py")!r}, run_name="__main__")
"""
    result = run_job(script, np=2, timeout=240, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    accuracy = float(out.split("test accuracy ")[1].split("%")[0])
    assert accuracy > 50.0, out  # ten classes: chance is 10%
    assert out.count("checkpoint written") == 1 and checkpoint.exists(), out  # rank 0 only

    script = f"""
import runpy, sys
sys.argv = ["b", "--model", "small_cnn", "--batch-size", "4", "--image-size", "32", "--num-iters", "2",
            "--num-batches-per-iter", "2", "--num-warmup-batches", "1", "--fp16-allreduce"]
runpy.run_path({os.path.join(ROOT, "examples", "tensorflow2_synthetic_benchmark.py")!r}, run_name="__main__")
"""
    result = run_job(script, np=2, timeout=240, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "total img/sec on 2 rank(s)" in out, out
