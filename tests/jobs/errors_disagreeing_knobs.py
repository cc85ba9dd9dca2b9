"""Ranks 1 and 2 each set a knob that every rank must share differently from the others; init() fails on every
rank, naming each knob, its values and the ranks that hold them."""

import os

from hvdlite.common import basics
from hvdlite.common.errors import InvalidArgumentError

rank = int(os.environ["HVDLITE_RANK"])
if rank == 2:
    os.environ["HVDLITE_FUSION_THRESHOLD"] = "1024"  # this rank would fuse differently from the others
if rank == 1:
    os.environ["HOROVOD_SMALL_MESSAGE_BYTES"] = "1"  # and this one would pick other algorithms

try:
    basics.init()
except InvalidArgumentError as error:
    print("REFUSED %d %s" % (rank, str(error).replace(chr(10), " ")), flush=True)
else:
    print("INITIALIZED %d" % rank, flush=True)
