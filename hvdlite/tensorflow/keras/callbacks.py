"""Keras 3 callbacks with horovod.tensorflow.keras.callbacks' names and semantics."""

import keras
import numpy as np

from hvdlite.common.basics import global_process_set, size
from hvdlite.common.ops import Average
from hvdlite.tensorflow import bridge
from hvdlite.tensorflow.functions import allgather_object, broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from root_rank's model and optimizer state.

    Runs in on_train_begin, before the first step: Keras 3 builds the model and the optimizer (its slot
    variables, iteration count, learning rate) before that, and the optimizer is built here otherwise. Model
    weights (trainable and not, e.g. batch-norm statistics) and optimizer variables travel in one broadcast per
    dtype. Done once, on the first fit().

    local_variables (as in Horovod): a variable or a collection of variables that keep each rank's own value
    (e.g. the weights of layers trained locally, see PartialDistributedOptimizer). A Keras variable may be given
    as itself or as the TensorFlow variable it holds (`v.value`).
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set, frozenset)):
            local_variables = [local_variables]
        self.local_variables = list(local_variables)

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        variables = list(model.weights)
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
            variables += list(optimizer.variables)
        local = [obj for v in self.local_variables for obj in _aliases(v)]  # kept alive while ids are compared
        local_ids = {id(obj) for obj in local}
        variables = [v for v in variables if not any(id(obj) in local_ids for obj in _aliases(v))]
        broadcast_variables(variables, self.root_rank, name="BroadcastGlobalVariablesCallback")
        self.broadcast_done = True


def _aliases(variable) -> list:
    """The objects a variable may be given as: itself and, for a Keras variable, the TensorFlow variable it
    holds."""
    return [variable, variable.value] if isinstance(variable, keras.Variable) else [variable]


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces every numeric value in the epoch-end logs (training and validation metrics) by its average over
    the ranks, in one allreduce. Put it before callbacks that read the logs (checkpointing, ReduceLROnPlateau,
    early stopping) so they see the same values on every rank."""

    def __init__(self, device: str = ""):
        super().__init__()
        self._checked_keys = None

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = tuple(sorted(k for k, v in logs.items() if np.ndim(v) == 0 and _is_number(v)))
        if keys != self._checked_keys:  # ranks must average the same metrics: check once per key set
            everyone = allgather_object(keys, name="MetricAverageCallback.keys")
            if any(k != keys for k in everyone):
                raise ValueError(f"MetricAverageCallback: ranks log different metrics: {everyone}")
            self._checked_keys = keys
        if not keys:
            return
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = bridge.np_allreduce(values, "MetricAverageCallback", Average, global_process_set)
        for k, v in zip(keys, averaged.tolist()):
            logs[k] = v


def _is_number(value) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def _base_optimizer(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer -> the optimizer it wraps


def _momentum_slots(optimizer):
    """Velocity variables that include the learning rate (SGD and RMSprop with momentum)."""
    optimizer = _base_optimizer(optimizer)
    try:
        momentum = float(getattr(optimizer, "momentum", 0.0) or 0.0)
    except (TypeError, ValueError):
        return []
    if momentum == 0.0:
        return []
    for attr in ("momentums", "_momentums"):
        slots = getattr(optimizer, attr, None)
        if slots:
            return [s for s in slots if s is not None]
    return []


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to initial_lr * multiplier(epoch) between start_epoch and end_epoch: at the
    start of each epoch (staircase) or before every batch with a fractional epoch (staircase=False).

    momentum_correction (Goyal et al., 2017): when the learning rate changes from old to new, SGD's (and
    RMSprop's) velocity, which carries the old rate, is scaled by new/old. Horovod did this by changing the
    momentum hyper-parameter for one batch; Keras 3 compiles that hyper-parameter into the train function as a
    constant, so hvdlite scales the velocity variables instead (identical update for plain momentum).
    """

    def __init__(
        self,
        initial_lr,
        multiplier,
        start_epoch=0,
        end_epoch=None,
        staircase=True,
        momentum_correction=True,
        steps_per_epoch=None,
        *args,
    ):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        if not callable(multiplier):
            self.staircase = True
            self.multiplier = lambda epoch: multiplier
        else:
            self.multiplier = multiplier

    def _get_lr(self) -> float:
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def _autodetect_steps_per_epoch(self):
        if self.params.get("steps"):
            return self.params["steps"]
        raise ValueError(
            f"could not autodetect the number of steps per epoch; pass steps_per_epoch to {type(self).__name__}()"
        )

    def _adjust_learning_rate(self, epoch):
        old_lr = self._get_lr()
        new_lr = float(self.initial_lr * self.multiplier(epoch))
        if new_lr == old_lr:
            return
        self.model.optimizer.learning_rate = new_lr
        if self.momentum_correction and old_lr > 0:
            for slot in _momentum_slots(self.model.optimizer):
                slot.assign(slot * (new_lr / old_lr))

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = self._get_lr()
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = self._get_lr()


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup (Goyal et al., 2017): the learning rate grows from initial_lr / size to initial_lr
    over warmup_epochs, adjusted before every batch. initial_lr is the (already size-scaled) target rate."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0, *args):
        def multiplier(epoch):
            # Round numbers at the end of each epoch (Horovod's formula).
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: finished gradient warmup. New learning rate is {self._get_lr():g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """ModelCheckpoint that keeps only the best model by `monitor` (Horovod's BestModelCheckpoint, made for
    estimators that choose the file later: `filepath` may be given now or assigned before training starts).

    As with ModelCheckpoint, add it on one rank only (usually rank 0), after MetricAverageCallback so that the
    monitored value is the average over the ranks.
    """

    def __init__(
        self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto", save_freq="epoch", filepath=None
    ):
        # Keras 3 checks the file extension in __init__; with the path still unknown, check it in on_train_begin.
        placeholder = "unset.weights.h5" if save_weights_only else "unset.keras"
        super().__init__(
            filepath=placeholder,
            monitor=monitor,
            verbose=verbose,
            save_best_only=True,
            save_weights_only=save_weights_only,
            mode=mode,
            save_freq=save_freq,
        )
        self.filepath = None if filepath is None else str(filepath)
        if self.filepath is not None:
            self._check_filepath()

    def _check_filepath(self):
        if self.filepath is None:
            raise ValueError(
                "BestModelCheckpoint: set its filepath (callback.filepath = 'best.keras') before training"
            )
        suffixes = (".weights.h5",) if self.save_weights_only else (".keras", ".h5")
        if not str(self.filepath).endswith(suffixes):
            raise ValueError(
                f"BestModelCheckpoint: filepath must end in {' or '.join(suffixes)} with "
                f"save_weights_only={self.save_weights_only}; got {self.filepath}"
            )

    def on_train_begin(self, logs=None):
        self.filepath = None if self.filepath is None else str(self.filepath)
        self._check_filepath()
        super().on_train_begin(logs)
