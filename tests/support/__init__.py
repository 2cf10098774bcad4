"""Reliability engines shared by the tests (short mode) and ``tests/support/reliability_report.py`` (long).

Each engine module exposes ``run(short: bool, seeds: int | None, minutes: float | None) -> dict``
returning a JSON-able section of the report. To add a section: write ``tests/support/<name>.py``
with such a ``run`` and add one line to ``SECTIONS`` in ``tests/support/reliability_report.py``.

- :mod:`.fsmodel`: a recording file system for :mod:`memoriesd.vault.fsio` and the power-loss
  model that rebuilds what the disk may hold at each sync point.
- :mod:`.scenarios`: vault operations driven through the daemon's own request dispatch.
- :mod:`.power_loss`: crash at every sync point of every scenario, reopen with the real code.
- :mod:`.io_errors`: ``ENOSPC`` / ``EIO`` at every step of every scenario.
"""
