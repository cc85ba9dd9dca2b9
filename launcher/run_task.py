"""The rank side of ``hvdlite.run(fn)``: ``python -m hvdlite.runner.run_task``, started by the launcher.

Protocol, over the job's rendezvous service (so it works on hosts that share no filesystem with the caller):
the caller stores the cloudpickled ``(fn, args, kwargs)`` as blob "fn" in scope "hvdlite.run"; every rank
fetches it, calls it and stores ``("ok", result)`` or ``("error", traceback text)`` as blob "result.<rank>".
A blob is stored in chunks below the service's request limit, with its chunk count written last. The blob also
carries fn's source file, which cloudpickle (3.1.3 on) replaces with "<dynamic-code>" in what it pickles by
value: the rank puts it back, so tracebacks name the file.
"""

import json
import os
import sys
import traceback

from hvdlite.common.rendezvous import MAX_BODY_SIZE, RendezvousClient, client_from_env

SCOPE = "hvdlite.run"
CHUNK = MAX_BODY_SIZE // 2


def put_blob(client: RendezvousClient, key: str, data: bytes) -> None:
    chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
    for index, chunk in enumerate(chunks):
        client.put(SCOPE, f"{key}.{index}", chunk)
    client.put(SCOPE, key, json.dumps({"chunks": len(chunks)}).encode())


def get_blob(client: RendezvousClient, key: str, wait: float) -> bytes:
    """Waits up to ``wait`` seconds for the blob (raises TimeoutError)."""
    count = json.loads(client.get(SCOPE, key, wait=wait))["chunks"]
    return b"".join(client.get(SCOPE, f"{key}.{index}", wait=0) for index in range(count))


DYNAMIC_CODE = "<dynamic-code>"


def pack_call(fn, args, kwargs) -> bytes:
    """The "fn" blob: the call, and fn's source file for restore_source_file."""
    import cloudpickle

    source_file = getattr(getattr(fn, "__code__", None), "co_filename", None)
    return cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}), source_file))


def _with_file(code, source_file: str):
    """code with co_filename (its own and its nested functions') set back to source_file."""
    consts = tuple(_with_file(c, source_file) if isinstance(c, type(code)) else c for c in code.co_consts)
    filename = source_file if code.co_filename == DYNAMIC_CODE else code.co_filename
    return code.replace(co_filename=filename, co_consts=consts)


def restore_source_file(fn, source_file: str) -> None:
    """Puts source_file back into fn and into the functions of fn's module that came with it by value."""
    functions = [fn] + [
        value
        for value in getattr(fn, "__globals__", {}).values()
        if callable(value) and getattr(value, "__module__", None) == getattr(fn, "__module__", "")
    ]
    for function in functions:
        code = getattr(function, "__code__", None)
        if code is not None and code.co_filename == DYNAMIC_CODE:
            function.__code__ = _with_file(code, source_file)


def main() -> int:
    import cloudpickle

    rank = int(os.environ["HVDLITE_RANK"])
    timeout = float(os.environ.get("HVDLITE_START_TIMEOUT", "60"))
    client = client_from_env(timeout=timeout)
    fn, args, kwargs, source_file = cloudpickle.loads(get_blob(client, "fn", wait=timeout))
    if source_file:
        restore_source_file(fn, source_file)
    try:
        outcome = ("ok", fn(*args, **kwargs))
        payload = cloudpickle.dumps(outcome)
    except BaseException as error:  # noqa: B902 - SystemExit and KeyboardInterrupt in fn are failures too
        from hvdlite.common import basics

        basics.note_failure(error)  # the other ranks' collectives then fail naming this rank and the error
        text = traceback.format_exc()
        sys.stderr.write(text)
        put_blob(client, f"result.{rank}", cloudpickle.dumps(("error", text)))
        return 1
    put_blob(client, f"result.{rank}", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
