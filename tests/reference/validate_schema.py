#!/usr/bin/python3
"""Validates JSON records (one per line on stdin) against a JSON Schema file, with Debian's
python3-jsonschema: an implementation independent of the worker's own types.

    validate_schema.py SCHEMA < records.jsonl

Prints one line per invalid record (its index and the errors) and exits 1 if any."""

import json
import sys

import jsonschema

schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
bad = 0
count = 0
for i, line in enumerate(sys.stdin):
    if not line.strip():
        continue
    count += 1
    errors = sorted(validator.iter_errors(json.loads(line)), key=lambda e: list(e.path))
    if errors:
        bad += 1
        for e in errors:
            print(f"record {i}: {'/'.join(map(str, e.path)) or '(root)'}: {e.message}")
print(f"{count} records, {bad} invalid")
sys.exit(1 if bad or count == 0 else 0)
