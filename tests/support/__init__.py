"""What the tests import besides fixtures: the reliability engines and the format-vector generator.

The reliability engines run in short mode under pytest and long under
``.venv/bin/python -m tests.support.reliability_report`` (from the repository root). Each exposes
``run(short: bool, seeds: int | None, minutes: float | None) -> dict`` returning a JSON-able section
of the report. To add a section: write ``tests/support/<name>.py`` with such a ``run`` and add one
line to ``SECTIONS`` in :mod:`.reliability_report`.

- :mod:`.fsmodel`: a recording file system for :mod:`memoriesd.vault.fsio` and the power-loss
  model that rebuilds what the disk may hold at each sync point.
- :mod:`.scenarios`: vault operations driven through the daemon's own request dispatch.
- :mod:`.power_loss`: crash at every sync point of every scenario, reopen with the real code.
- :mod:`.io_errors`: ``ENOSPC`` / ``EIO`` at every step of every scenario.
- :mod:`.live`: a real daemon process and its socket; :mod:`.stateful` (with :mod:`.stateful_model`
  and :mod:`.stateful_pairs`), :mod:`.fuzz`, :mod:`.fuzz_mcp` and :mod:`.process_shape` drive one.
- :mod:`.make_format_vectors` (building blocks in :mod:`.format_vectors_lib`): writes
  ``tests/vectors``; run as ``python -m tests.support.make_format_vectors``, never imported by a test
  (it replaces ``os.urandom`` in its process).
"""
