"""One rank of a test job: runs a module of tests/jobs/ (its top level, or one of its functions) with pytest's
assertion rewriting, so that a failed `assert` says what its operands were, as in a test.

    python tests/jobs/run.py MODULE[:FUNCTION] [ARGS...]

The function, if named, is called with ARGS as strings. Modules of tests/jobs/ that a job imports are rewritten
too. On success the rank prints ``OK MODULE[:FUNCTION]``; on an exception it prints ``FAILED`` and the traceback,
whose assertion message holds pytest's explanation, and exits 1. tests/multiproc.py's run_job_function starts
it on every rank and turns the ranks' failures into one assertion error.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import traceback

JOBS_DIR = os.environ.get("HVDLITE_TEST_JOBS_DIR") or os.path.dirname(os.path.abspath(__file__))

try:
    from _pytest.assertion.rewrite import rewrite_asserts
except ImportError:  # pytest's internals moved: plain assertions still fail, with less said
    rewrite_asserts = None


class RewritingLoader(importlib.abc.SourceLoader):
    """Loads a module of tests/jobs/ with its assertions rewritten as pytest rewrites a test module's."""

    def __init__(self, path):
        self.path = path

    def get_filename(self, fullname):
        return self.path

    def get_data(self, path):
        with open(path, "rb") as f:
            return f.read()

    def source_to_code(self, data, path, *, _optimize=-1):
        tree = ast.parse(data, path)
        if rewrite_asserts is not None:
            rewrite_asserts(tree, data, path)
        return compile(tree, path, "exec", dont_inherit=True)


class JobsFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of tests/jobs/ and the tests' shared helpers (tests/hvdjob.py), rewriting both. A name
    that an installed or standard module also has stays that module's."""

    folders = (JOBS_DIR, os.path.dirname(JOBS_DIR))

    def find_spec(self, fullname, path=None, target=None):
        if "." in fullname:
            return None
        for folder in self.folders:
            candidate = os.path.join(folder, fullname + ".py")
            if os.path.isfile(candidate):
                elsewhere = [p for p in sys.path if os.path.abspath(p or ".") not in self.folders]
                if importlib.machinery.PathFinder.find_spec(fullname, elsewhere) is not None:
                    return None
                return importlib.util.spec_from_file_location(fullname, candidate, loader=RewritingLoader(candidate))
        return None


def main(argv):
    target, args = argv[0], argv[1:]
    module_name, _, function = target.partition(":")
    sys.meta_path.insert(0, JobsFinder())
    # The job sees its own arguments, as a script would.
    sys.argv = [os.path.join(JOBS_DIR, module_name + ".py")] + args
    try:
        if function:
            module = importlib.import_module(module_name)
            getattr(module, function)(*args)
        else:
            path = os.path.join(JOBS_DIR, module_name + ".py")
            exec(RewritingLoader(path).get_code("__main__"), {"__name__": "__main__", "__file__": path})
    except BaseException as exc:
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        print("FAILED %s" % target, flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    print("OK %s" % target, flush=True)
    return 0


if __name__ == "__main__":
    # A rank that passed falls through to the end of the file, where the job starter may append its fast exit.
    if main(sys.argv[1:]):
        sys.exit(1)
