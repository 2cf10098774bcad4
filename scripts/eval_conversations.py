#!/usr/bin/env python3
"""Conversation recall on LoCoMo-format files: the issue-31 table, per file and over all files.

A thin runner: the measuring is ``bench/eval_conversations.py``, the variants and daemons
``bench/conversation_runs.py``, the tables and sign tests ``bench/conversation_report.py``. ``bench/``
is the clone's folder of measurements, not an installed package, so when this file is run by path
(``.venv/bin/python scripts/eval_conversations.py DIR ...``) the package is loaded from the folder
beside it (``python -m scripts.eval_conversations`` from the clone's root imports it as usual).
``--help`` says how to run it and what each column means.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

RUNNER = "bench.conversation_runs"


def _runner() -> ModuleType:
    """``bench.conversation_runs``, importing the ``bench`` package from this clone when it is not on the path."""
    try:
        return importlib.import_module(RUNNER)
    except ModuleNotFoundError as exc:
        if exc.name != "bench":
            raise
    folder = Path(__file__).resolve().parents[1] / "bench"
    spec = importlib.util.spec_from_file_location(
        "bench", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(
            f"eval_conversations: no bench package in {folder}: run it from a clone of the repository"
        )
    package = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = package
    spec.loader.exec_module(package)
    return importlib.import_module(RUNNER)


if __name__ == "__main__":
    _runner().main()
