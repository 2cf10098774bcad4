"""Names `vulture` (scripts/test.sh, ``[tool.vulture]`` in pyproject.toml) reports unused but that are used.

Vulture reads the product alone, so what only tests, benchmarks or a library reach shows as dead.
Each line names one such use; a name that becomes truly dead leaves this file with its code.
Typer commands, MCP tools and daemon handlers are left out by ``ignore_decorators`` instead.
"""

# ruff: noqa: B018, F821 - bare attribute names are vulture's whitelist format; `_` is never run

# Read or set by a library, not by our code.
_._custom_shell_complete  # click: the completion class a shell name maps to (memories_cli/completion.py)
_.__doc__  # Typer's help text, assigned after the command is built (conversation_cmds, extract_cmds)
_.collect_usage_pieces  # click.Command override (memories_cli/help.py)
_.get_short_help_str  # click.Command / click.Group overrides (memories_cli/help.py)
_.format_commands  # click.Group override: `memories --help` from the command table (memories_cli/lazy.py)
_.encode_special_tokens  # tokenizers.Tokenizer setting (memoriesd/embed/local.py)
_.intra_op_num_threads  # onnxruntime.SessionOptions settings (memoriesd/embed/local.py)
_.inter_op_num_threads
_.log_severity_level
_.execution_mode
_.graph_optimization_level
_.__cause__  # exception chaining set by hand (memoriesd/vault/store.py)
_.on_any_event  # watchdog.events.FileSystemEventHandler override (memoriesd/watch/watcher.py)

# Seams the tests and benchmarks use: part of each module's interface, not reached by the product itself.
_.total_bytes  # ModelManifest: tests/test_model_install.py
installed_files_match  # embed/install.py: tests/test_model_install.py
load_all  # memories_cli/lazy.py: tests/test_help.py loads every command of the table
_.waiting  # embed/schedule.py EmbedQueue: tests/test_embed_fairness.py waits for queued batches
fixed_batches  # embed/local.py: the naive plan bench/bench_embed.py compares against
_.token_ids  # LocalEmbedder: tests/test_robust_tokens.py, tests/test_embed_local.py
_.snapshot_info  # index/caches.py: tests/test_vector_stream.py
_.build  # VectorIndex.build: tests/test_vector_precision.py, tests/test_vector_encodings.py
_.matrix  # VectorIndex.matrix: tests/test_vectors.py
_.misses  # QueryCache counters: tests/test_query_cache.py
is_configured  # text/segment.py: tests/test_text_fragments.py
index_stats  # index/docs.py: tests/test_bm25.py (what BM25Index.stats must equal)
decode_full_log  # vault/format.py: tests/test_log_recovery.py, tests/test_rekey.py
installed  # vault/fsio.py: the seam tests/support installs a recording or failing file system through
