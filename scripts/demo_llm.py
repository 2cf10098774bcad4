#!/usr/bin/env python3
"""A tiny loopback generation service for the demo (no model, no network): it speaks the
OpenAI-compatible chat-completions protocol and Gemini's generateContent, and answers
extractively with the first sentence of source S1, citing [S1] in the JSON format `rag ask`
requires. It stands in for Ollama/llama.cpp or a hosted model so the demo runs offline.

    scripts/demo_llm.py PORT_FILE     # binds 127.0.0.1 on a free port and writes the port to PORT_FILE
"""

from __future__ import annotations

import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SOURCE = re.compile(r'<source id="(S\d+)"[^>]*>\s*(.*?)\s*</source>', re.S)


def answer_for(prompt: str) -> str:
    found = SOURCE.findall(prompt)
    if not found:
        return json.dumps({"answer": "The notes do not say.", "citations": [], "insufficient": True})
    label, text = found[0]
    sentence = re.split(r"(?<=[.!?。！？])\s*", " ".join(text.split()))[0][:300]
    return json.dumps({"answer": f"According to your notes: {sentence} [{label}]", "citations": [label]})


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        return

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path.endswith(":generateContent"):
            prompt = " ".join(p.get("text", "") for c in body.get("contents", []) for p in c.get("parts", []))
            out = {"candidates": [{"content": {"role": "model", "parts": [{"text": answer_for(prompt)}]}, "finishReason": "STOP"}]}
        else:
            prompt = " ".join(m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user")
            out = {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer_for(prompt)}, "finish_reason": "stop"}]}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Path(sys.argv[1]).write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
