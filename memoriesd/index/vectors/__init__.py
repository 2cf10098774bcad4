"""Vector search state of a vault: the matrix searched, its sealed sidecar files, and the space that binds them to an embedder."""
