"""init() with an algorithm setting: each rank prints REFUSED and the error where init() refuses it. argv: a knob
and the value every rank but rank 0 sets for it (none: the environment as the test gives it)."""

import os
import sys

from hvdlite.common import basics
from hvdlite.common.errors import InvalidArgumentError

if len(sys.argv) > 2 and int(os.environ["HOROVOD_RANK"]):
    os.environ["HVDLITE_" + sys.argv[1]] = sys.argv[2]
try:
    basics.init()
except InvalidArgumentError as error:
    print("REFUSED %s" % str(error).replace(chr(10), " "), flush=True)
