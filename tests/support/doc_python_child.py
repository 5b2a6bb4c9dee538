"""The fresh Python interpreter that runs one documentation section's ``python`` blocks.

Started by :class:`readme_helpers.PythonChild` in the section's working directory, with the
section's environment (``LOGSTORE_BOOTSTRAP``, ``PATH``), as a reader's own ``python`` would be:
nothing of the test run is imported, so every block must create what it uses (a SparkSession
included). The blocks of one section run in order in one namespace, so a later block can use
an earlier one's variables.

Protocol: one JSON object a line on stdin, ``{"source", "path", "first_line"}`` to run a block, or
``{"exit": true}``; one JSON object a line back, ``{"ok", "stdout", "error"}``, on the file
descriptor that was stdout when the process started. File descriptor 1 is pointed at stderr
before any block runs, so what a JVM or a subprocess prints cannot break the protocol; what a
block prints through ``sys.stdout`` is captured and returned as its output (compared with a
``text output`` block by the parent). A block's code is compiled with the page's path and its
lines at their place in the page, so a traceback names the page and line of the failing line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from typing import Any


def _stop_spark() -> None:
    """Stop the streaming queries and the SparkSession a section left running."""
    if "pyspark" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return
    for query in spark.streams.active:
        with contextlib.suppress(Exception):
            query.stop()
    spark.stop()


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    # As ``python script.py`` run in the working directory: its modules importable, not ours.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, os.getcwd())
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("exit"):
            break
        buffer = io.StringIO()
        ok, error = True, ""
        try:
            # Padded with blank lines so the code's line numbers are the page's.
            source = "\n" * (request["first_line"] - 1) + request["source"]
            code = compile(source, request["path"], "exec")
            with contextlib.redirect_stdout(buffer):
                exec(code, namespace)
        except BaseException:  # noqa: BLE001 - every failure is the block's, reported to the parent
            ok, error = False, traceback.format_exc()
        replies.write(json.dumps({"ok": ok, "stdout": buffer.getvalue(), "error": error}) + "\n")
        replies.flush()
    _stop_spark()


if __name__ == "__main__":
    main()
