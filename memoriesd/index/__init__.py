"""Search state of an unlocked vault: the lexical index (bm25, query, snapshot, keeper), the indexed
documents (docs), the per-vault cache (caches) and the vectors (vectors/)."""
