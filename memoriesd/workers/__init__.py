"""The daemon's processes: a router, one process per unlocked vault, one model process.

The main daemon (the *router*) keeps what holds no vault plaintext: the vault list, create/delete,
the socket clients first reach, and one *worker* process per unlocked vault. A worker is the same
daemon code bound to one vault on its own socket in ``run/``; clients ask the router once where a
vault is served (``vault.route``) and send that vault's requests, passphrases included, straight
to the worker. Lock, auto-lock, delete and daemon stop end the worker process, so its memory
(decrypted records, request frames, the index, freed buffers) goes back to the kernel instead of
lingering in a long-lived heap. The local embedding model runs in a *model* process that the
router ends after a vault it served locks. See SECURITY.md "What is wiped".

- :mod:`.routes`: which requests go where (light: the CLI imports it);
- :mod:`.router`: the router's side (spawning, locking and asking workers; the model process);
- :mod:`.worker`: a worker's side;
- :mod:`.model` and :mod:`.model_client`: the model process and a worker's embedder that uses it;
- :mod:`.process`: process set-up shared by all of them (isolated start, hardening, logging).
"""
