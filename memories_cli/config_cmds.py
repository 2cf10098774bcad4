"""`memories config show`: the value in force of every config.toml option, and where it came from.

A pure read of the file with the daemon's own parser (:mod:`memoriesd.config`, which imports no
numpy): the daemon is never started. Sources: ``default``, ``config.toml``, ``deprecated key
rag.x`` (an old spelling still read for a release) and ``derived: why``. The daemon applies the file
at start, so after an edit its values are these only once `memories daemon restart` has run.
"""

from __future__ import annotations

import typer

from .state import STATE, echo, emit_json, notice

config_app = typer.Typer(
    help="The settings of config.toml: `config show` prints every option with its value and source.",
    no_args_is_help=True,
)


@config_app.command(
    "show",
    epilog="""Examples:

\b
  memories config show
  memories config show --json | jq '.options[] | select(.source != "default")'""",
)
def show() -> None:
    """Print every option's value in force, its default and where it came from (default, config.toml, a deprecated key, derived).

    Reads config.toml with the daemon's own validation; an invalid file is an error naming the key.
    Old keys still read are listed with the key that replaces them (fix: rename them). Never starts
    the daemon; after an edit, `memories daemon restart` applies the file.
    """
    from dataclasses import asdict

    from memoriesd.config import effective_options, load_config, render_text

    path = STATE.home.config_path
    cfg = load_config(path)
    options = effective_options(cfg)
    if STATE.json:
        emit_json({"config": str(path), "exists": path.exists(), "options": [asdict(o) for o in options],
                   "deprecated": list(cfg.deprecated)})
        return
    where = str(path) if path.exists() else f"{path} (absent: every option has its default)"
    echo(f"# config.toml: {where}")
    echo(render_text(options))
    for line in cfg.deprecated:
        notice(line)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
