#!/usr/bin/env python3
"""Extract the request-body JSON Schemas of the two chat endpoints agentd calls, and the
response, stream-event and error schemas of the endpoints it serves in their shape (SPEC §17),
from the providers' OpenAPI descriptions, for the conformance tests in
src/llm/conformance_tests.rs.

For each provider this finds the operation (Anthropic `POST /v1/messages`, OpenAI
`POST /chat/completions`), takes the `$ref` of its JSON request body, and copies that schema
plus the transitive closure of every `#/components/schemas/...` it references into one
self-contained JSON Schema (2020-12, the dialect of OpenAPI 3.1):

    {"$schema": ..., "$ref": "#/components/schemas/<Root>", "components": {"schemas": {...}}}

OpenAPI-only constructs are converted or dropped on the way:
  - `nullable: true` (OpenAPI 3.0) becomes an explicit `null` alternative;
  - boolean `exclusiveMinimum`/`exclusiveMaximum` (OpenAPI 3.0) become numeric bounds;
  - annotations that do not affect validation are dropped to keep the fixtures small:
    `description`, `title`, `example(s)`, `deprecated`, `discriminator`, `externalDocs`, `x-*`.
Any `$ref` outside `#/components/schemas/` is an error: the tests cannot fetch anything.

Usage:
    python3 scripts/extract-spec-schemas.py SPECS_DIR [OUT_DIR]

SPECS_DIR holds anthropic.openapi.json and openai.openapi.json; OUT_DIR defaults to
tests/fixtures/specs next to this script's repository root. Standard library only; the output
is deterministic (schemas sorted by name), so re-running on the same input changes nothing.
"""

import json
import sys
from pathlib import Path

SCHEMA_PREFIX = "#/components/schemas/"
DIALECT = "https://json-schema.org/draft/2020-12/schema"

# (spec file, what, output file). `what` is ("request", path, method): the JSON request body
# of that operation; ("response", path, method, status, content type): a response body of it;
# ("schema", name): a named schema (stream events the operation's responses do not name).
TARGETS = [
    ("anthropic.openapi.json", ("request", "/v1/messages", "post"), "anthropic-messages-request.schema.json"),
    ("openai.openapi.json", ("request", "/chat/completions", "post"), "openai-chat-request.schema.json"),
    # The server side (SPEC §17): what agentd answers as an OpenAI- or Anthropic-compatible API.
    ("openai.openapi.json", ("response", "/chat/completions", "post", "200", "application/json"),
     "openai-chat-response.schema.json"),
    ("openai.openapi.json", ("response", "/chat/completions", "post", "200", "text/event-stream"),
     "openai-chat-chunk.schema.json"),
    ("openai.openapi.json", ("response", "/models", "get", "200", "application/json"),
     "openai-models-response.schema.json"),
    ("openai.openapi.json", ("schema", "ErrorResponse"), "openai-error.schema.json"),
    ("openai.openapi.json", ("response", "/responses", "post", "200", "application/json"),
     "openai-response.schema.json"),
    ("openai.openapi.json", ("response", "/responses", "post", "200", "text/event-stream"),
     "openai-response-event.schema.json"),
    ("anthropic.openapi.json", ("response", "/v1/messages/count_tokens", "post", "200", "application/json"),
     "anthropic-count-tokens-response.schema.json"),
    ("anthropic.openapi.json", ("response", "/v1/models/{model_id}", "get", "200", "application/json"),
     "anthropic-model-response.schema.json"),
    ("anthropic.openapi.json", ("response", "/v1/messages", "post", "200", "application/json"),
     "anthropic-message-response.schema.json"),
    ("anthropic.openapi.json", ("response", "/v1/messages", "post", "4XX", "application/json"),
     "anthropic-error.schema.json"),
    ("anthropic.openapi.json", ("schema", "MessageStreamEvent"), "anthropic-stream-event.schema.json"),
]

# Annotation keywords that never change a validation result.
DROPPED_KEYWORDS = {
    "description",
    "title",
    "example",
    "examples",
    "deprecated",
    "discriminator",
    "externalDocs",
}

# Keywords whose value is a map of name -> schema.
SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
# Keywords whose value is one schema (or a boolean schema).
SCHEMA_SINGLE = {
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
}
# Keywords whose value is a list of schemas.
SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}


class ExtractError(Exception):
    pass


def convert(schema, where, refs):
    """A converted copy of `schema`; every local schema name it references is added to `refs`."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise ExtractError(f"{where}: expected a schema object, found {type(schema).__name__}")

    out = {}
    for key, value in schema.items():
        if key in DROPPED_KEYWORDS or key.startswith("x-") or key == "nullable":
            continue
        if key == "$ref":
            if not isinstance(value, str) or not value.startswith(SCHEMA_PREFIX):
                raise ExtractError(f"{where}: $ref {value!r} is not a local components/schemas reference")
            refs.add(value[len(SCHEMA_PREFIX):])
            out[key] = value
        elif key in SCHEMA_MAPS:
            out[key] = {name: convert(sub, f"{where}/{key}/{name}", refs) for name, sub in value.items()}
        elif key in SCHEMA_SINGLE:
            if isinstance(value, list):  # draft-04 style tuple `items`
                out[key] = [convert(sub, f"{where}/{key}/{i}", refs) for i, sub in enumerate(value)]
            else:
                out[key] = convert(value, f"{where}/{key}", refs)
        elif key in SCHEMA_LISTS:
            out[key] = [convert(sub, f"{where}/{key}/{i}", refs) for i, sub in enumerate(value)]
        else:
            out[key] = value

    fix_exclusive_bounds(out)
    if schema.get("nullable") is True:
        out = allow_null(out)
    return out


def fix_exclusive_bounds(out):
    """OpenAPI 3.0 `minimum: 0, exclusiveMinimum: true` → JSON Schema `exclusiveMinimum: 0`."""
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        flag = out.get(exclusive)
        if isinstance(flag, bool):
            del out[exclusive]
            if flag and bound in out:
                out[exclusive] = out.pop(bound)


def allow_null(out):
    """The schema `out` or null (OpenAPI 3.0 `nullable: true`)."""
    kind = out.get("type")
    simple = "$ref" not in out and not any(k in out for k in SCHEMA_LISTS)
    if simple and isinstance(kind, str):
        out["type"] = [kind, "null"]
    elif simple and isinstance(kind, list):
        if "null" not in kind:
            out["type"] = kind + ["null"]
    else:
        return {"anyOf": [out, {"type": "null"}]}
    if "enum" in out and None not in out["enum"]:
        out["enum"] = out["enum"] + [None]
    return out


def request_root(spec, path, method, spec_name):
    """The components/schemas name of the JSON request body of `method path`."""
    operation = spec.get("paths", {}).get(path, {}).get(method)
    if operation is None:
        raise ExtractError(f"{spec_name}: no operation {method.upper()} {path}")
    body = operation.get("requestBody")
    if body is None:
        raise ExtractError(f"{spec_name}: {method.upper()} {path} has no requestBody")
    ref = body.get("$ref")
    if ref is not None:  # a shared #/components/requestBodies entry
        name = ref.rsplit("/", 1)[-1]
        body = spec.get("components", {}).get("requestBodies", {}).get(name)
        if body is None:
            raise ExtractError(f"{spec_name}: requestBody $ref {ref!r} does not resolve")
    schema = body.get("content", {}).get("application/json", {}).get("schema", {})
    ref = schema.get("$ref", "")
    if not ref.startswith(SCHEMA_PREFIX):
        raise ExtractError(
            f"{spec_name}: {method.upper()} {path} request body is not a components/schemas $ref"
        )
    return ref[len(SCHEMA_PREFIX):]


def response_root(spec, path, method, status, content_type, spec_name):
    """The components/schemas name of the `content_type` body of `status` of `method path`."""
    operation = spec.get("paths", {}).get(path, {}).get(method)
    if operation is None:
        raise ExtractError(f"{spec_name}: no operation {method.upper()} {path}")
    response = operation.get("responses", {}).get(status)
    if response is None:
        raise ExtractError(f"{spec_name}: {method.upper()} {path} has no {status} response")
    schema = response.get("content", {}).get(content_type, {}).get("schema", {})
    ref = schema.get("$ref", "")
    if not ref.startswith(SCHEMA_PREFIX):
        raise ExtractError(
            f"{spec_name}: {method.upper()} {path} {status} {content_type} is not a components/schemas $ref"
        )
    return ref[len(SCHEMA_PREFIX):]


def root_of(spec, what, spec_name):
    """The root schema name a target names."""
    kind = what[0]
    if kind == "request":
        return request_root(spec, what[1], what[2], spec_name)
    if kind == "response":
        return response_root(spec, *what[1:], spec_name)
    if kind == "schema":
        return what[1]
    raise ExtractError(f"unknown target kind {kind!r}")


def extract(spec, root, spec_name):
    """The self-contained schema document for `root` and its reference closure."""
    schemas = spec.get("components", {}).get("schemas", {})
    done = {}
    pending = [root]
    while pending:
        name = pending.pop()
        if name in done:
            continue
        if name not in schemas:
            raise ExtractError(f"{spec_name}: #/components/schemas/{name} does not exist")
        refs = set()
        done[name] = convert(schemas[name], f"{spec_name}#/components/schemas/{name}", refs)
        pending.extend(sorted(refs - done.keys()))
    return {
        "$schema": DIALECT,
        "$comment": (
            f"Generated by scripts/extract-spec-schemas.py from {spec_name} "
            f"(info.version {spec.get('info', {}).get('version', 'unversioned')}); do not edit."
        ),
        "$ref": SCHEMA_PREFIX + root,
        "components": {"schemas": {name: done[name] for name in sorted(done)}},
    }


def main(argv):
    if len(argv) not in (2, 3) or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    specs_dir = Path(argv[1])
    out_dir = Path(argv[2]) if len(argv) == 3 else Path(__file__).resolve().parent.parent / "tests/fixtures/specs"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for spec_file, what, out_file in TARGETS:
            source = specs_dir / spec_file
            try:
                spec = json.loads(source.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ExtractError(f"cannot read {source}: {e}") from e
            root = root_of(spec, what, spec_file)
            doc = extract(spec, root, spec_file)
            target = out_dir / out_file
            target.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            count = len(doc["components"]["schemas"])
            print(f"{target}: {root} + {count - 1} referenced schemas")
    except ExtractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
