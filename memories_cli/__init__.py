"""The thin `memories` CLI: parse → one request → render."""
