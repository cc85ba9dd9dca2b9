"""One exception hierarchy, mapped one-to-one from the core's status codes (hvdlite_status in hvdlite.h)."""


class HvdliteError(RuntimeError):
    """Base class of every error hvdlite raises for a failed operation."""


# Drop-in name for code written against Horovod (`except hvd.HorovodInternalError`).
HorovodInternalError = HvdliteError


class InvalidArgumentError(HvdliteError, ValueError):
    """Bad usage on this rank: unknown process set, root not in the set, wrong splits, duplicate name..."""


class NotInitializedError(HvdliteError, ValueError):
    """hvdlite.init() was not called, or hvdlite was shut down."""


class MismatchError(HvdliteError):
    """Ranks submitted incompatible requests for one tensor (dtype, shape, op, root, reduce op, scaling)."""


class PeerError(HvdliteError):
    """A peer process died or a connection broke; the job cannot continue."""


class HvdliteTimeoutError(HvdliteError, TimeoutError):
    """A deadline passed (a silent peer, a stalled tensor, a wait with a timeout)."""


class InternalError(HvdliteError):
    """A bug in hvdlite, or a peer running a different build."""


class AbortedError(HvdliteError):
    """hvdlite shut down while the operation was pending."""


_BY_STATUS = {
    2: InvalidArgumentError,
    3: NotInitializedError,
    4: MismatchError,
    5: PeerError,
    6: HvdliteTimeoutError,
    7: InternalError,
    8: AbortedError,
}


def error_for_status(status: int, message: str) -> HvdliteError:
    return _BY_STATUS.get(status, HvdliteError)(message)
