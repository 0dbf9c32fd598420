#!/usr/bin/env python3
"""A stand-in for kube-apiserver, for the DRA tests (tests/support/dra.rs starts it).

It serves, as JSON over HTTP/1.1, the endpoints vramgate-dra and the scheduler's part in the
tests use: Nodes (read), ResourceSlices (list with field selectors, get, create with
generateName, replace with resourceVersion, delete, delete collection) and ResourceClaims
(create, get, replace status, delete) of `resource.k8s.io/v1`, as Kubernetes 1.36 has them.

Every object written is checked before it is stored, as strictly as the real server:
- against the upstream OpenAPI schema of Kubernetes 1.36 in its strict JSON-schema form
  (`additionalProperties: false` everywhere, from PyPI's kubernetes-validate, fetched by
  scripts/fetch-k8s-schemas): a misspelt or unknown field is a 422, as the real server's
  strict field validation makes it;
- against the cross-field rules the schema cannot say, which kube-apiserver checks in
  pkg/apis/resource/validation: names, exactly one node selection, device and attribute
  limits, and the consumable-capacity request policy (validRange / validValues / default).
It checks one thing the real server does not: a pool's generation never goes down (consumers
use only the newest generation, so a driver that lowered it would be ignored).

Not implemented: watch, patch, server-side apply, authentication, protobuf, other kinds.

Test-only endpoints: GET /_writes (every accepted write, with its time) and GET /_rejected
(every refused write, with the reason).

Usage: apiserver.py --schemas DIR --node NAME [--node NAME ...]
Prints `listening http://127.0.0.1:PORT` once ready.
"""

import argparse
import copy
import datetime
import fractions
import json
import os
import random
import re
import string
import sys
import threading
import time
import urllib.parse
import uuid
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema

GROUP = "/apis/resource.k8s.io/v1"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
QUANTITY = re.compile(r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|n|u|m|k|M|G|T|P|E|)$")
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL = {"n": fractions.Fraction(1, 10**9), "u": fractions.Fraction(1, 10**6), "m": fractions.Fraction(1, 1000),
           "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
SLICE_FIELDS = {"spec.driver", "spec.nodeName"}
MAX_DEVICES = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING = 64
MAX_VALID_VALUES = 10


class Invalid(Exception):
    """A 422 with the field paths of what is wrong."""


class Refused(Exception):
    def __init__(self, code, reason, message):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def quantity(value, path):
    """A Kubernetes quantity as an exact number (bytes, for memory); Invalid if malformed."""
    if not isinstance(value, str):
        value = str(value)
    m = QUANTITY.match(value)
    if not m:
        raise Invalid(f"{path}: Invalid value: {value!r}: quantities must match the regular expression "
                      "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    sign, number, suffix = m.groups()
    n = fractions.Fraction(number)
    if suffix in BINARY:
        n *= BINARY[suffix]
    elif suffix[:1] in ("e", "E"):
        n *= fractions.Fraction(10) ** int(suffix[1:])
    else:
        n *= DECIMAL[suffix]
    return -n if sign == "-" else n


def ceil_value(q):
    """Quantity.Value(): rounded up to an integer, as the API server compares capacities."""
    return -((-q.numerator) // q.denominator)


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Schemas:
    """The strict 1.36 schemas (JSON Schema 2020-12). Each names its definitions by URL
    (`$id` https://kubernetes.io/api/..., `$ref` /api/_definitions.json#/$defs/...): that URL is
    served from DIR's `_definitions.json`, so nothing is fetched."""

    def __init__(self, directory):
        self.directory = os.path.abspath(directory)
        with open(os.path.join(self.directory, "_definitions.json")) as f:
            self.definitions = json.load(f)
        self.validators = {}

    def validator(self, name):
        if name not in self.validators:
            with open(os.path.join(self.directory, name)) as f:
                schema = json.load(f)
            cls = jsonschema.validators.validator_for(schema)
            with warnings.catch_warnings():
                # RefResolver is the one API both Debian 12's jsonschema (4.10) and newer ones
                # (which deprecate it) have.
                warnings.simplefilter("ignore", DeprecationWarning)
                resolver = jsonschema.RefResolver(
                    base_uri=schema.get("$id", ""),
                    referrer=schema,
                    store={self.definitions["$id"]: self.definitions},
                )
                self.validators[name] = cls(schema, resolver=resolver)
        return self.validators[name]

    def check(self, name, obj):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            errors = sorted(self.validator(name).iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            def where(e):
                parts = ""
                for p in e.absolute_path:
                    parts += f"[{p}]" if isinstance(p, int) else (("." if parts else "") + str(p))
                return parts or "<root>"
            raise Invalid("; ".join(f"{where(e)}: {e.message}" for e in errors))


def check_slice(obj, nodes, highest_generation):
    """kube-apiserver's ResourceSlice validation (pkg/apis/resource/validation) for v1."""
    errs = []
    meta, spec = obj.get("metadata", {}), obj.get("spec", {})
    name = meta.get("name", "")
    if not name or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        errs.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain")
    driver = spec.get("driver", "")
    if not driver or len(driver) > 63 or not DNS_SUBDOMAIN.match(driver):
        errs.append(f"spec.driver: Invalid value: {driver!r}: a DNS subdomain of at most 63 characters")
    pool = spec.get("pool", {})
    if not pool.get("name"):
        errs.append("spec.pool.name: Required value")
    if pool.get("generation", -1) < 0:
        errs.append("spec.pool.generation: Invalid value: must be greater than or equal to 0")
    if pool.get("resourceSliceCount", 0) < 1:
        errs.append("spec.pool.resourceSliceCount: Invalid value: must be greater than 0")
    key = (driver, pool.get("name"))
    if pool.get("generation", 0) < highest_generation.get(key, 0):
        errs.append(f"spec.pool.generation: Invalid value: {pool.get('generation')}: lower than "
                    f"{highest_generation[key]}, the pool's newest (stand-in's own check)")
    selections = [k for k in ("nodeName", "nodeSelector") if spec.get(k)]
    selections += [k for k in ("allNodes", "perDeviceNodeSelection") if spec.get(k) is True]
    if len(selections) != 1:
        errs.append(f"spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                    f"`perDeviceNodeSelection` is required, got {selections}")
    if spec.get("nodeName") and spec["nodeName"] not in nodes:
        errs.append(f"spec.nodeName: Invalid value: {spec['nodeName']!r}: no such node (stand-in's nodes: {sorted(nodes)})")
    devices = spec.get("devices") or []
    if len(devices) > MAX_DEVICES:
        errs.append(f"spec.devices: Too many: {len(devices)}: must have at most {MAX_DEVICES} items")
    seen = set()
    for i, d in enumerate(devices):
        errs += check_device(d, f"spec.devices[{i}]", seen)
    if errs:
        raise Invalid("; ".join(errs))


def qualified_name_errors(name, path):
    parts = name.split("/")
    if len(parts) == 2:
        domain, ident = parts
        if not DNS_SUBDOMAIN.match(domain) or len(domain) > 63:
            return [f"{path}: Invalid value: {name!r}: the domain must be a DNS subdomain"]
    elif len(parts) == 1:
        ident = parts[0]
    else:
        return [f"{path}: Invalid value: {name!r}"]
    if not C_IDENTIFIER.match(ident) or len(ident) > 32:
        return [f"{path}: Invalid value: {name!r}: a C identifier of at most 32 characters"]
    return []


def check_device(d, path, seen):
    errs = []
    name = d.get("name", "")
    if not name or len(name) > 63 or not DNS_LABEL.match(name):
        errs.append(f"{path}.name: Invalid value: {name!r}: a lowercase RFC 1123 label")
    if name in seen:
        errs.append(f"{path}.name: Duplicate value: {name!r}")
    seen.add(name)
    attributes, capacity = d.get("attributes") or {}, d.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errs.append(f"{path}: Too many: {len(attributes) + len(capacity)}: attributes and capacities "
                    f"must have at most {MAX_ATTRIBUTES_AND_CAPACITIES} items")
    for key, attribute in attributes.items():
        where = f"{path}.attributes[{key}]"
        errs += qualified_name_errors(key, where)
        set_fields = [k for k, v in attribute.items() if v is not None]
        if len(set_fields) != 1:
            errs.append(f"{where}: Invalid value: exactly one value must be specified, got {set_fields}")
        for k in ("string", "version"):
            if isinstance(attribute.get(k), str) and len(attribute[k]) > MAX_STRING:
                errs.append(f"{where}.{k}: Too long: may not be more than {MAX_STRING} bytes")
    for key, cap in capacity.items():
        where = f"{path}.capacity[{key}]"
        errs += qualified_name_errors(key, where)
        try:
            errs += check_capacity(cap, where, d.get("allowMultipleAllocations") is True)
        except Invalid as e:
            errs.append(str(e))
    return errs


def check_capacity(cap, path, multiple):
    """validateDeviceCapacity and validateRequestPolicy of kube-apiserver."""
    errs = []
    value = quantity(cap.get("value"), f"{path}.value")
    policy = cap.get("requestPolicy")
    if policy is None:
        return errs
    if not multiple:
        return [f"{path}.requestPolicy: Forbidden: allowMultipleAllocations must be true to set a requestPolicy"]
    valid_range, valid_values = policy.get("validRange"), policy.get("validValues")
    if valid_range is not None and valid_values is not None:
        return [f"{path}.requestPolicy: Invalid value: exactly one policy can be specified, validRange or validValues"]
    if valid_range is None and valid_values is None:
        return errs
    if policy.get("default") is None:
        return [f"{path}.requestPolicy.default: Required value: required when validRange or validValues is defined"]
    default = quantity(policy["default"], f"{path}.requestPolicy.default")
    if valid_values is not None:
        where = f"{path}.requestPolicy.validValues"
        if len(valid_values) > MAX_VALID_VALUES:
            return [f"{where}: Too many: {len(valid_values)}: must have at most {MAX_VALID_VALUES} items"]
        options = [quantity(v, f"{where}[{i}]") for i, v in enumerate(valid_values)]
        for i in range(len(options) - 1):
            if options[i] > options[i + 1]:
                errs.append(f"{where}[{i + 1}]: Invalid value: values must be sorted in ascending order")
        for i, option in enumerate(options):
            if option > value:
                errs.append(f"{where}[{i}]: Invalid value: option is larger than capacity value")
        if default not in options:
            errs.append(f"{where}: Invalid value: {policy['default']!r}: default value is not valid according to the requestPolicy")
        return errs
    where = f"{path}.requestPolicy.validRange"
    if valid_range.get("min") is None:
        return [f"{where}.min: Required value: required when validRange is defined"]
    low = quantity(valid_range["min"], f"{where}.min")
    if low > value:
        errs.append(f"{where}.min: Invalid value: min is larger than capacity value")
    if default < low:
        errs.append(f"{where}.min: Invalid value: {policy['default']!r}: default is less than min")
    high = valid_range.get("max")
    if high is not None:
        high = quantity(high, f"{where}.max")
        if low > high:
            errs.append(f"{where}.max: Invalid value: min is larger than max")
        if high > value:
            errs.append(f"{where}.max: Invalid value: max is larger than capacity value")
        if default > high:
            errs.append(f"{where}.max: Invalid value: default is more than max")
    step = valid_range.get("step")
    if step is not None:
        step = quantity(step, f"{where}.step")
        if low + step > value:
            errs.append(f"{where}.step: Invalid value: one step is larger than capacity value")
        step_v, low_v = ceil_value(step), ceil_value(low)
        for name, q in (("default", default), ("max", high)):
            if q is not None and step_v and (ceil_value(q) - low_v) % step_v != 0:
                errs.append(f"{where}.step: Invalid value: {name} is not a multiple of a given step from min")
    return errs


def check_claim_status(obj):
    errs = []
    results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    for i, r in enumerate(results):
        where = f"status.allocation.devices.results[{i}]"
        for field in ("request", "driver", "pool", "device"):
            if not r.get(field):
                errs.append(f"{where}.{field}: Required value")
        if r.get("shareID") is not None and not UUID.match(r["shareID"]):
            errs.append(f"{where}.shareID: Invalid value: {r['shareID']!r}: must be a lowercase UUID in 8-4-4-4-12 format")
        for key, q in (r.get("consumedCapacity") or {}).items():
            try:
                quantity(q, f"{where}.consumedCapacity[{key}]")
            except Invalid as e:
                errs.append(str(e))
    if errs:
        raise Invalid("; ".join(errs))


class Store:
    def __init__(self, schemas, nodes):
        self.lock = threading.Lock()
        self.schemas = schemas
        self.version = 0
        self.nodes = {}
        for name in nodes:
            self.nodes[name] = self.stamp({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        self.slices = {}
        self.claims = {}
        self.highest_generation = {}
        self.writes = []
        self.rejected = []

    def stamp(self, obj, old=None):
        self.version += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.version)
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta["generation"] = 1
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            meta["generation"] = old["metadata"].get("generation", 1) + (obj.get("spec") != old.get("spec"))
        return obj

    def admit_slice(self, obj):
        self.schemas.check("resourceslice-resource-v1.json", obj)
        check_slice(obj, self.nodes, self.highest_generation)
        pool = obj["spec"]["pool"]
        key = (obj["spec"]["driver"], pool["name"])
        self.highest_generation[key] = max(self.highest_generation.get(key, 0), pool["generation"])


def selector(query):
    """The field selector of a list or delete-collection, as (key, value) pairs."""
    raw = query.get("fieldSelector", [""])[0]
    pairs = []
    for term in filter(None, raw.split(",")):
        key, _, value = term.partition("=")
        if key.endswith("="):
            key = key[:-1]
        value = value.lstrip("=")
        if key not in SLICE_FIELDS:
            raise Refused(400, "BadRequest", f'unable to parse requested fieldSelector "{raw}": '
                          f'field label not supported: {key}')
        pairs.append((key, value))
    return pairs


def matches(obj, pairs):
    spec = obj.get("spec", {})
    return all(spec.get(k.split(".", 1)[1]) == v for k, v in pairs)


def status(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; without TCP_NODELAY the body waits for the
    # client's delayed ACK of the headers (40 ms on Linux), which a real API server
    # (Go's net/http sets TCP_NODELAY) never adds.
    disable_nagle_algorithm = True
    store = None

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (time.strftime("%H:%M:%S"), fmt % args))

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError as e:
            raise Refused(400, "BadRequest", f"the body is not JSON: {e}")

    def handle_any(self, method):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query.lstrip("&"))
        path = url.path.rstrip("/")
        store = self.store
        try:
            with store.lock:
                code, body, name = self.route(method, path, query, store)
                if method != "GET":
                    store.writes.append({"method": method, "path": path, "name": name, "time_ns": time.time_ns()})
            self.reply(code, body)
        except Refused as e:
            if method != "GET":
                with store.lock:
                    store.rejected.append({"method": method, "path": path, "code": e.code, "message": e.message})
            self.reply(e.code, status(e.code, e.reason, e.message))
        except Invalid as e:
            with store.lock:
                store.rejected.append({"method": method, "path": path, "code": 422, "message": str(e)})
            self.reply(422, status(422, "Invalid", str(e)))
        except Exception as e:  # A bug here must fail the test that met it, not hang it.
            message = f"stand-in API server error: {type(e).__name__}: {e}"
            sys.stderr.write(message + "\n")
            with store.lock:
                store.rejected.append({"method": method, "path": path, "code": 500, "message": message})
            self.reply(500, status(500, "InternalError", message))

    def route(self, method, path, query, store):
        if path == "/_writes" and method == "GET":
            return 200, store.writes, None
        if path == "/_rejected" and method == "GET":
            return 200, store.rejected, None
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)", path)
        if m and method == "GET":
            node = store.nodes.get(m.group(1))
            if node is None:
                raise Refused(404, "NotFound", f'nodes "{m.group(1)}" not found')
            return 200, node, None
        if path == GROUP + "/resourceslices":
            return self.slices_collection(method, query, store)
        m = re.fullmatch(GROUP + r"/resourceslices/([^/]+)", path)
        if m:
            return self.one_slice(method, m.group(1), store)
        m = re.fullmatch(GROUP + r"/namespaces/([^/]+)/resourceclaims(?:/([^/]+))?(/status)?", path)
        if m:
            return self.claims(method, m.group(1), m.group(2), bool(m.group(3)), store)
        raise Refused(404, "NotFound", f"the server could not find the requested resource ({method} {path})")

    def slices_collection(self, method, query, store):
        if method == "GET":
            pairs = selector(query)
            items = [copy.deepcopy(s) for s in store.slices.values() if matches(s, pairs)]
            return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                         "metadata": {"resourceVersion": str(store.version)}, "items": items}, None
        if method == "POST":
            obj = self.body()
            meta = obj.setdefault("metadata", {})
            for server_set in ("resourceVersion", "uid", "creationTimestamp", "generation"):
                meta.pop(server_set, None)
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            name = meta.get("name", "")
            if name in store.slices:
                raise Refused(409, "AlreadyExists", f'resourceslices.resource.k8s.io "{name}" already exists')
            store.stamp(obj)
            store.admit_slice(obj)
            store.slices[name] = obj
            return 201, obj, name
        if method == "DELETE":
            pairs = selector(query)
            gone = [n for n, s in store.slices.items() if matches(s, pairs)]
            items = [store.slices.pop(n) for n in gone]
            return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                         "metadata": {}, "items": items}, ",".join(gone)
        raise Refused(405, "MethodNotAllowed", f"{method} is not supported on resourceslices")

    def one_slice(self, method, name, store):
        old = store.slices.get(name)
        if method == "GET":
            if old is None:
                raise Refused(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
            return 200, old, None
        if method == "PUT":
            obj = self.body()
            meta = obj.setdefault("metadata", {})
            if meta.get("name") != name:
                raise Refused(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})")
            if old is None:
                raise Refused(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
            if meta.get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise Refused(409, "Conflict", f'Operation cannot be fulfilled on resourceslices.resource.k8s.io "{name}": '
                              "the object has been modified; please apply your changes to the latest version and try again")
            store.stamp(obj, old)
            store.admit_slice(obj)
            store.slices[name] = obj
            return 200, obj, name
        if method == "DELETE":
            if old is None:
                raise Refused(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
            del store.slices[name]
            return 200, old, name
        raise Refused(405, "MethodNotAllowed", f"{method} is not supported on a resourceslice")

    def claims(self, method, namespace, name, status_subresource, store):
        key = (namespace, name)
        old = store.claims.get(key)
        if name is None and method == "POST":
            obj = self.body()
            obj.pop("status", None)
            meta = obj.setdefault("metadata", {})
            meta["namespace"] = namespace
            name = meta.get("name", "")
            if (namespace, name) in store.claims:
                raise Refused(409, "AlreadyExists", f'resourceclaims.resource.k8s.io "{name}" already exists')
            store.stamp(obj)
            store.schemas.check("resourceclaim-resource-v1.json", obj)
            store.claims[(namespace, name)] = obj
            return 201, obj, name
        if name is None:
            raise Refused(405, "MethodNotAllowed", f"{method} is not supported on resourceclaims")
        if old is None:
            raise Refused(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found')
        if method == "GET":
            return 200, old, None
        if method == "PUT" and status_subresource:
            obj = self.body()
            if obj.get("metadata", {}).get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise Refused(409, "Conflict", f'Operation cannot be fulfilled on resourceclaims.resource.k8s.io "{name}": '
                              "the object has been modified; please apply your changes to the latest version and try again")
            updated = copy.deepcopy(old)
            updated["status"] = obj.get("status")
            store.stamp(updated, old)
            store.schemas.check("resourceclaim-resource-v1.json", updated)
            check_claim_status(updated)
            store.claims[key] = updated
            return 200, updated, name
        if method == "DELETE" and not status_subresource:
            del store.claims[key]
            return 200, old, name
        raise Refused(405, "MethodNotAllowed", f"{method} is not supported here")

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_DELETE(self):
        self.handle_any("DELETE")

    def do_PATCH(self):
        self.handle_any("PATCH")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", required=True, help="the v1.36.0-local-strict schema directory")
    parser.add_argument("--node", action="append", default=[], help="a Node that exists")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.schemas, "_definitions.json")):
        sys.exit(f"apiserver.py: {args.schemas}: no _definitions.json; run scripts/fetch-k8s-schemas")
    Handler.store = Store(Schemas(args.schemas), args.node)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
