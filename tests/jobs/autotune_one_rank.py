"""HVDLITE_AUTOTUNE set on rank 1 only: init() refuses on every rank, naming the setting and each rank's value."""

import os

from hvdjob import expect_raises

import hvdlite.torch as hvd

if os.environ["HVDLITE_RANK"] == "1":
    os.environ["HVDLITE_AUTOTUNE"] = "1"
expect_raises(
    "autotune on rank 1 only",
    hvd.HvdliteError,
    hvd.init,
    match=["HVDLITE_AUTOTUNE differs between ranks", "0 on rank 0", "1 on rank 1"],
)
