#!/usr/bin/env python3
"""Checks every object of Kubernetes manifests (k8s/*.yaml) against Kubernetes 1.36's strict
JSON schemas, as `kubectl apply --validate=strict` would have the API server check them: an
unknown or misspelt field, a wrong type or a missing required field is an error. The schemas
are those of the stand-in API server (tests/support/apiserver.py, Schemas), fetched by
scripts/fetch-k8s-schemas. Cross-field rules the API server adds (CEL compiling, names) are
not checked here; the stand-in compiles a policy's CEL when it loads it.

Prints one line per object (`FILE: KIND NAME ok`); exits 1 after the first file with an
invalid object or a kind without a schema, naming them.

Usage: check_manifests.py [--schemas DIR] FILE...   (default DIR: $VRAMGATE_K8S_SCHEMAS, else
/var/cache/vramgate-tests/k8s-json-schema-1.36)
"""

import argparse
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apiserver import Invalid, Schemas  # noqa: E402


def schema_name(api_version, kind):
    """The schema file of a kind: `<kind>-<group's first label>-<version>.json`, or
    `<kind>-<version>.json` for the core group (`v1`)."""
    group, _, version = api_version.rpartition("/")
    if not group:
        return f"{kind.lower()}-{version}.json"
    return f"{kind.lower()}-{group.split('.')[0]}-{version}.json"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", default=os.environ.get("VRAMGATE_K8S_SCHEMAS",
                                                            "/var/cache/vramgate-tests/k8s-json-schema-1.36"))
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.schemas, "_definitions.json")):
        sys.exit(f"check_manifests.py: {args.schemas}: no _definitions.json; run scripts/fetch-k8s-schemas")
    schemas = Schemas(args.schemas)
    for path in args.files:
        with open(path) as f:
            documents = [d for d in yaml.safe_load_all(f) if d is not None]
        if not documents:
            sys.exit(f"{path}: no objects")
        errors = []
        for i, obj in enumerate(documents):
            kind, api_version = obj.get("kind"), obj.get("apiVersion")
            name = (obj.get("metadata") or {}).get("name")
            what = f"{path}: {kind} {name}"
            if not kind or not api_version:
                errors.append(f"{path}: object {i} has no kind or apiVersion")
                continue
            schema = schema_name(api_version, kind)
            if not os.path.exists(os.path.join(args.schemas, schema)):
                errors.append(f"{what}: no schema {schema} for {api_version} {kind} in Kubernetes 1.36")
                continue
            try:
                schemas.check(schema, obj)
            except Invalid as e:
                errors.append(f"{what}: {e}")
                continue
            print(f"{what} ok")
        if errors:
            sys.exit("\n".join(errors))


if __name__ == "__main__":
    main()
