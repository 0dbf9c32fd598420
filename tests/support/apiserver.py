#!/usr/bin/env python3
"""A stand-in for kube-apiserver, for the DRA tests (tests/support/dra.rs starts it;
tests/support/apiserver_selftest.sh checks it).

It serves, as JSON over HTTP/1.1, the endpoints vramgate-dra and the scheduler's part in the
tests use: Nodes (read), ResourceSlices (list with field selectors, get, create with
generateName, replace with resourceVersion, delete, delete collection) and ResourceClaims
(create, get, list across namespaces, replace status, delete) of `resource.k8s.io/v1`, as Kubernetes 1.36 has them.
Objects live in memory; every accepted write bumps one global resourceVersion.

Every object written is checked before it is stored, as strictly as the real server:
- against the upstream OpenAPI schema of Kubernetes 1.36 in its strict JSON-schema form
  (`additionalProperties: false` everywhere, from PyPI's kubernetes-validate, fetched by
  scripts/fetch-k8s-schemas): a misspelt or unknown field is refused, as the real server's
  strict field validation refuses it (the real one answers 400 for an unknown field, this one
  422 like every other validation failure);
- against the cross-field rules the schema cannot say, which kube-apiserver checks in
  pkg/apis/resource/validation: names, exactly one node selection, device and attribute
  limits, the consumable-capacity request policy (validRange / validValues / default), the
  allocation results of a claim's status, and its `status.devices[]` (each an allocated
  device, once; `data` a JSON object of at most 10 KiB). That field is GA in Kubernetes 1.37
  (DRAResourceClaimDeviceStatus); its schema (AllocatedDeviceStatus) is the same in 1.36's
  and 1.37's, so the 1.36 schemas validate it as 1.37 would.
It checks two things the real server does not, on purpose: a pool's generation never goes
down (consumers use only a pool's newest generation, so a driver that lowered it would be
ignored, not refused), and `spec.nodeName` must name a Node given with --node. An update
must carry `metadata.resourceVersion` (the real server allows unconditional updates).

Callers: every request must carry `Authorization: Bearer TOKEN`; one without, or with a token
the server was not given, is a 401, as kube-apiserver answers when anonymous requests are
off. `--admin-token TOKEN` is the tests' own client, a cluster admin (system:masters).
`--user TOKEN USERNAME NODE` names a service account's token, with its groups and the user
extra `authentication.kubernetes.io/node-name: [NODE]` that a node-bound service account token
carries (none when NODE is empty).

Not authorization: every authenticated caller may call every endpoint here (no RBAC), and no
garbage collector removes objects whose owner is gone. Both are left to the real
kube-apiserver and kube-controller-manager that issue 45 puts into the suite, which exercise
k8s/dra.yaml's ClusterRole and RBAC bindings for real; this stand-in stays for what they do
not check (the schemas of the API version under test, the pool generation rule, the
test-only endpoints below).

With `--policy FILE` (k8s/dra.yaml), the ValidatingAdmissionPolicies and bindings in FILE are
evaluated on every ResourceSlice write and every update of a ResourceClaim's status, after the
validation above, as kube-apiserver's
admission does (tests/support/vap.py; needs cel-python, scripts/fetch-cel-python): a denial is
the Status kube-apiserver answers, with the policy's message.

Watch: ResourceClaims across namespaces only (`?watch=true`, what the DRA driver's claim
watcher asks). Not implemented: other watches, patch, server-side apply, TLS and other authentication, RBAC and
garbage collection (see above), protobuf, label selectors (ignored), other kinds and other API versions.

Test-only endpoints: GET /_writes (every accepted write, with its time), GET /_rejected
(every refused write, with the reason), and POST /_refuse with {"method", "suffix", "code",
"count"}: the next `count` writes of that method whose path ends with `suffix` are answered
with `code` (409: a Conflict, else an InternalError), as a busy or failing API server answers.

Works with Debian 12's python3-jsonschema (4.10) and with current releases (4.26).

Usage: apiserver.py --schemas DIR --admin-token TOKEN --node NAME [--node NAME ...]
                    [--policy FILE] [--user TOKEN USERNAME NODE ...]
Prints `listening http://127.0.0.1:PORT` once ready; one line per request on stderr.
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

vap = None  # tests/support/vap.py, imported by main() when a policy is given

GROUP_VERSION = "resource.k8s.io/v1"
GROUP = "/apis/" + GROUP_VERSION
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# resource.ParseQuantity: sign, decimal number, then a binary suffix, a decimal exponent or
# a decimal SI suffix ("E" alone is exa, "e3"/"E3" an exponent).
QUANTITY = re.compile(
    r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|n|u|m|k|M|G|T|P|E|)$")
BINARY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL_SUFFIX = {"n": fractions.Fraction(1, 10**9), "u": fractions.Fraction(1, 10**6),
                  "m": fractions.Fraction(1, 1000), "": 1, "k": 10**3, "M": 10**6, "G": 10**9,
                  "T": 10**12, "P": 10**15, "E": 10**18}
SLICE_FIELD_LABELS = {"spec.driver", "spec.nodeName"}
# Limits of pkg/apis/resource (ResourceSliceMaxDevices, ResourceSliceMaxAttributesAndCapacitiesPerDevice,
# DeviceAttributeMaxValueLength, CapacityRequestPolicyDiscreteMaxOptions, DeviceMaxIDLength,
# DriverNameMaxLength).
MAX_DEVICES = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE = 64
MAX_VALID_VALUES = 10
MAX_IDENTIFIER = 32
MAX_DRIVER_NAME = 63
CONFLICT = "the object has been modified; please apply your changes to the latest version and try again"


class Invalid(Exception):
    """A 422: the message lists each error as `<field path>: <what is wrong>`."""


class Refused(Exception):
    """Any other refusal: an HTTP code, a Status reason and a message."""

    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def quantity(value, path):
    """A Kubernetes quantity as an exact number (bytes, for memory); Invalid if malformed."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise Invalid(f"{path}: Invalid value: {value!r}: a quantity is a string")
    text = str(value)
    m = QUANTITY.match(text)
    if not m:
        raise Invalid(f"{path}: Invalid value: {text!r}: quantities must match the regular expression "
                      "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    sign, number, suffix = m.groups()
    exact = fractions.Fraction(number)
    if suffix in BINARY_SUFFIX:
        exact *= BINARY_SUFFIX[suffix]
    elif suffix in DECIMAL_SUFFIX:
        exact *= DECIMAL_SUFFIX[suffix]
    else:  # a decimal exponent
        exact *= fractions.Fraction(10) ** int(suffix[1:])
    return -exact if sign == "-" else exact


def ceil_value(exact):
    """Quantity.Value(): the integer, rounded up (the step rules compare these)."""
    return -((-exact.numerator) // exact.denominator)


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def field(obj, key):
    """obj[key] as a dict; JSON null or absent reads as empty, as Go's decoding makes it."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def items(obj, key):
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


class Schemas:
    """The strict 1.36 schemas. They are JSON Schema 2020-12, not draft 4: each names its
    definitions by URL (`$id` https://kubernetes.io/api/..., `$ref` /api/_definitions.json#/$defs/...),
    so `_definitions.json` from DIR is put in the resolver's store under its own `$id` and
    nothing is fetched."""

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
                # (which deprecate it for `referencing`) have.
                warnings.simplefilter("ignore", DeprecationWarning)
                resolver = jsonschema.RefResolver(
                    base_uri=schema.get("$id", "file://" + self.directory + "/"),
                    referrer=schema,
                    store={self.definitions.get("$id", "file://" + self.directory + "/_definitions.json"):
                           self.definitions},
                )
                self.validators[name] = cls(schema, resolver=resolver)
        return self.validators[name]

    def check(self, name, obj):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            errors = list(self.validator(name).iter_errors(obj))
        if not errors:
            return
        messages = []
        for e in errors:
            where = list(e.absolute_path)
            if e.validator == "additionalProperties" and isinstance(e.instance, dict):
                # Name the unknown field in the path, as the real server's strict decoding does.
                known = e.schema.get("properties", {})
                for extra in sorted(k for k in e.instance if k not in known):
                    messages.append((where + [extra], e.message))
            else:
                messages.append((where, e.message))
        messages.sort(key=lambda m: [(0, p, "") if isinstance(p, int) else (1, 0, p) for p in m[0]])
        raise Invalid("; ".join(f"{json_path(p)}: {message}" for p, message in messages))


def json_path(parts):
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (("." if text else "") + str(p))
    return text or "<root>"


def check_slice(obj, nodes, highest_generation):
    """kube-apiserver's ResourceSlice validation (pkg/apis/resource/validation), for what the
    schema passed; plus the stand-in's own generation and node checks."""
    errs = []
    meta, spec = field(obj, "metadata"), field(obj, "spec")
    name = meta.get("name") or ""
    if not name or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        errs.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist "
                    "of lower case alphanumeric characters, '-' or '.', and must start and end with an "
                    "alphanumeric character (at most 253 characters)")
    driver = spec.get("driver") or ""
    if not driver or len(driver) > MAX_DRIVER_NAME or not DNS_SUBDOMAIN.match(driver):
        errs.append(f"spec.driver: Invalid value: {driver!r}: a DNS subdomain of at most {MAX_DRIVER_NAME} characters")
    pool = field(spec, "pool")
    if not pool.get("name"):
        errs.append("spec.pool.name: Required value")
    generation = pool.get("generation") or 0
    if generation < 0:
        errs.append(f"spec.pool.generation: Invalid value: {generation}: must be greater than or equal to 0")
    if (pool.get("resourceSliceCount") or 0) < 1:
        errs.append(f"spec.pool.resourceSliceCount: Invalid value: {pool.get('resourceSliceCount')}: "
                    "must be greater than 0")
    # Not a rule of the real server: consumers ignore every slice of a pool but those of its
    # highest generation, so a slice written with a lower one would be silently unused.
    newest = highest_generation(driver, pool.get("name"))
    if newest is not None and generation < newest:
        errs.append(f"spec.pool.generation: Invalid value: {generation}: lower than {newest}, "
                    "the pool's newest (stand-in's own check)")
    selections = [k for k in ("nodeName", "nodeSelector") if spec.get(k)]
    selections += [k for k in ("allNodes", "perDeviceNodeSelection") if spec.get(k) is True]
    if len(selections) != 1:
        errs.append("spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                    f"`perDeviceNodeSelection` is required, got {selections}")
    if spec.get("nodeName") and spec["nodeName"] not in nodes:
        errs.append(f"spec.nodeName: Invalid value: {spec['nodeName']!r}: no such node "
                    f"(stand-in's nodes: {sorted(nodes)})")
    devices = items(spec, "devices")
    if len(devices) > MAX_DEVICES:
        errs.append(f"spec.devices: Too many: {len(devices)}: must have at most {MAX_DEVICES} items")
    seen = set()
    for i, device in enumerate(devices):
        errs += check_device(device if isinstance(device, dict) else {}, f"spec.devices[{i}]", seen)
    if errs:
        raise Invalid("; ".join(errs))


def qualified_name_errors(name, path):
    """validateQualifiedName: a C identifier, optionally prefixed by `<driver-like domain>/`."""
    parts = name.split("/")
    if len(parts) > 2:
        return [f"{path}: Invalid value: {name!r}: at most one '/'"]
    errs = []
    if len(parts) == 2:
        domain = parts[0]
        if not domain or len(domain) > MAX_DRIVER_NAME or not DNS_SUBDOMAIN.match(domain):
            errs.append(f"{path}: Invalid value: {name!r}: the domain must be a DNS subdomain of at most "
                        f"{MAX_DRIVER_NAME} characters")
    identifier = parts[-1]
    if not C_IDENTIFIER.match(identifier) or len(identifier) > MAX_IDENTIFIER:
        errs.append(f"{path}: Invalid value: {name!r}: a C identifier of at most {MAX_IDENTIFIER} characters")
    return errs


def check_device(device, path, seen):
    errs = []
    name = device.get("name") or ""
    if not name or len(name) > 63 or not DNS_LABEL.match(name):
        errs.append(f"{path}.name: Invalid value: {name!r}: a lowercase RFC 1123 label must consist of lower "
                    "case alphanumeric characters or '-', and must start and end with an alphanumeric "
                    "character (at most 63 characters)")
    if name in seen:
        errs.append(f"{path}.name: Duplicate value: {name!r}")
    seen.add(name)
    attributes, capacity = field(device, "attributes"), field(device, "capacity")
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errs.append(f"{path}: Too many: {len(attributes) + len(capacity)}: the total number of attributes "
                    f"and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}")
    for key, attribute in attributes.items():
        where = f"{path}.attributes[{key}]"
        errs += qualified_name_errors(key, where)
        attribute = attribute if isinstance(attribute, dict) else {}
        set_fields = sorted(k for k, v in attribute.items() if v is not None)
        if len(set_fields) != 1:
            errs.append(f"{where}: Invalid value: exactly one value must be specified, got {set_fields}")
        for kind in ("string", "version"):
            if isinstance(attribute.get(kind), str) and len(attribute[kind]) > MAX_ATTRIBUTE_VALUE:
                errs.append(f"{where}.{kind}: Too long: may not be more than {MAX_ATTRIBUTE_VALUE} bytes")
    shareable = device.get("allowMultipleAllocations") is True
    for key, cap in capacity.items():
        where = f"{path}.capacity[{key}]"
        errs += qualified_name_errors(key, where)
        try:
            errs += check_capacity(cap if isinstance(cap, dict) else {}, where, shareable)
        except Invalid as e:
            errs.append(str(e))
    return errs


def check_capacity(cap, path, shareable):
    """validateDeviceCapacity and validateRequestPolicy* of kube-apiserver. Comparisons are
    exact (Quantity.Cmp); the step rules use Quantity.Value(), which rounds up."""
    errs = []
    value = quantity(cap.get("value"), f"{path}.value")
    policy = cap.get("requestPolicy")
    if policy is None:
        return errs
    if not shareable:
        return [f"{path}.requestPolicy: Forbidden: allowMultipleAllocations must be true to set a requestPolicy"]
    valid_range, valid_values = policy.get("validRange"), policy.get("validValues") or None
    if valid_range is not None and valid_values is not None:
        return [f"{path}.requestPolicy: Forbidden: exactly one policy can be specified, cannot specify "
                '"validValues" and "validRange" at the same time']
    if valid_range is None and valid_values is None:
        return errs  # A default alone is allowed.
    if policy.get("default") is None:
        which = "validRange" if valid_range is not None else "validValues"
        return [f"{path}.requestPolicy.default: Required value: required when {which} is defined"]
    default = quantity(policy["default"], f"{path}.requestPolicy.default")
    if valid_values is not None:
        return check_valid_values(value, default, policy["default"], valid_values,
                                  f"{path}.requestPolicy.validValues")
    return check_valid_range(value, default, policy["default"], valid_range, f"{path}.requestPolicy.validRange")


def check_valid_values(value, default, default_text, valid_values, where):
    errs = []
    if len(valid_values) > MAX_VALID_VALUES:
        return [f"{where}: Too many: {len(valid_values)}: must have at most {MAX_VALID_VALUES} items"]
    options = [quantity(v, f"{where}[{i}]") for i, v in enumerate(valid_values)]
    for i in range(1, len(options)):
        if options[i - 1] > options[i]:
            errs.append(f"{where}[{i}]: Invalid value: {valid_values[i]!r}: values must be sorted in ascending order")
        if options[i] in options[:i]:
            errs.append(f"{where}[{i}]: Duplicate value: {valid_values[i]!r}")
    for i, option in enumerate(options):
        if option > value:
            errs.append(f"{where}[{i}]: Invalid value: {valid_values[i]!r}: option is larger than capacity value")
    if default not in options:
        errs.append(f"{where}: Invalid value: {default_text!r}: default value is not valid according to the requestPolicy")
    return errs


def check_valid_range(value, default, default_text, valid_range, where):
    errs = []
    if valid_range.get("min") is None:
        return [f"{where}.min: Required value: required when validRange is defined"]
    low = quantity(valid_range["min"], f"{where}.min")
    if low > value:
        errs.append(f"{where}.min: Invalid value: {valid_range['min']!r}: min is larger than capacity value")
    if default < low:
        errs.append(f"{where}.min: Invalid value: {default_text!r}: default is less than min")
    high = None
    if valid_range.get("max") is not None:
        high = quantity(valid_range["max"], f"{where}.max")
        if low > high:
            errs.append(f"{where}.max: Invalid value: {valid_range['min']!r}: min is larger than max")
        if high > value:
            errs.append(f"{where}.max: Invalid value: {valid_range['max']!r}: max is larger than capacity value")
        if default > high:
            errs.append(f"{where}.max: Invalid value: {default_text!r}: default is more than max")
    if valid_range.get("step") is not None:
        step = quantity(valid_range["step"], f"{where}.step")
        if low + step > value:
            errs.append(f"{where}.step: Invalid value: {valid_range['step']!r}: one step is larger than capacity value")
        step_value, low_value = ceil_value(step), ceil_value(low)
        if step_value <= 0:
            # The real server would divide by zero here; refuse it instead.
            errs.append(f"{where}.step: Invalid value: {valid_range['step']!r}: must be greater than 0")
            return errs
        for what, bound in (("default", default), ("max", high)):
            if bound is not None and (ceil_value(bound) - low_value) % step_value != 0:
                errs.append(f"{where}.step: Invalid value: {what} is not a multiple of a given step from min")
    return errs


def default_claim(obj):
    """kube-apiserver's defaults for a claim's requests (pkg/apis/resource/v1/defaults.go),
    set before validation as it sets them: `allocationMode: ExactCount`, and `count: 1` for
    ExactCount, on each request and subrequest; `operator: Equal` on each toleration. The
    scheduler's allocator reads the stored claim and refuses a request without a mode."""
    requests = items(field(field(obj, "spec"), "devices"), "requests")
    for request in requests:
        if not isinstance(request, dict):
            continue
        exact = [request.get("exactly")] + list(request.get("firstAvailable") or [])
        for r in exact:
            if not isinstance(r, dict):
                continue
            r.setdefault("allocationMode", "ExactCount")
            if r["allocationMode"] == "ExactCount" and not r.get("count"):
                r["count"] = 1
            for toleration in r.get("tolerations") or []:
                if isinstance(toleration, dict):
                    toleration.setdefault("operator", "Equal")


def check_claim(obj):
    """ResourceClaim rules the schema cannot say: its name, its allocation results, and the
    drivers' device status."""
    errs = []
    name = field(obj, "metadata").get("name") or ""
    if not name or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        errs.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain")
    results = items(field(field(field(obj, "status"), "allocation"), "devices"), "results")
    for i, result in enumerate(results):
        result = result if isinstance(result, dict) else {}
        where = f"status.allocation.devices.results[{i}]"
        for required in ("request", "driver", "pool", "device"):
            if not result.get(required):
                errs.append(f"{where}.{required}: Required value")
        share_id = result.get("shareID")
        if share_id is not None and not (isinstance(share_id, str) and UUID.match(share_id)):
            errs.append(f"{where}.shareID: Invalid value: {share_id!r}: must be a lowercase UUID in 8-4-4-4-12 format")
        for key, consumed in field(result, "consumedCapacity").items():
            try:
                quantity(consumed, f"{where}.consumedCapacity[{key}]")
            except Invalid as e:
                errs.append(str(e))
    errs += check_device_status(obj, results)
    if errs:
        raise Invalid("; ".join(errs))


# AllocatedDeviceStatusMaxConditions and AllocatedDeviceStatusDataMaxLength of pkg/apis/resource.
MAX_DEVICE_CONDITIONS = 8
MAX_DEVICE_DATA = 10 * 1024


def check_device_status(obj, results):
    """validateDeviceStatus of kube-apiserver, for `status.devices[]`: each entry names a device
    of the allocation (driver, pool, device and shareID together), at most once; its `data`
    is a JSON object of at most 10 KiB; at most 8 conditions."""
    errs = []
    allocated = set()
    for result in results:
        result = result if isinstance(result, dict) else {}
        allocated.add((result.get("driver"), result.get("pool"), result.get("device"), result.get("shareID")))
    seen = set()
    for i, device in enumerate(items(field(obj, "status"), "devices")):
        device = device if isinstance(device, dict) else {}
        where = f"status.devices[{i}]"
        key = (device.get("driver"), device.get("pool"), device.get("device"), device.get("shareID"))
        shown = "/".join(str(k) for k in key[:3]) + (f"/{key[3]}" if key[3] else "")
        if key in seen:
            errs.append(f"{where}: Duplicate value: {shown!r}")
        seen.add(key)
        if key not in allocated:
            errs.append(f"{where}: Invalid value: {shown!r}: must be an allocated device in the claim")
        share_id = device.get("shareID")
        if share_id is not None and not (isinstance(share_id, str) and UUID.match(share_id)):
            errs.append(f"{where}.shareID: Invalid value: {share_id!r}: must be a lowercase UUID in 8-4-4-4-12 format")
        conditions = items(device, "conditions")
        if len(conditions) > MAX_DEVICE_CONDITIONS:
            errs.append(f"{where}.conditions: Too many: {len(conditions)}: must have at most "
                        f"{MAX_DEVICE_CONDITIONS} items")
        data = device.get("data")
        if data is not None:
            raw = json.dumps(data, separators=(",", ":"))
            if len(raw) > MAX_DEVICE_DATA:
                errs.append(f"{where}.data: Too long: may not be more than {MAX_DEVICE_DATA} bytes")
            elif not isinstance(data, dict):
                errs.append(f"{where}.data: Invalid value: \"<value omitted>\": must be a valid JSON object")
    return errs


class Store:
    """Everything the stand-in holds; handlers take `lock` around each request."""

    def __init__(self, schemas, nodes, users=None, policies=None):
        self.lock = threading.Lock()
        self.schemas = schemas
        self.users = users or {}
        self.policies = policies
        self.version = 0
        self.nodes = {}
        for name in nodes:
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
            self.nodes[name] = self.commit(self.stamp(node))
        self.slices = {}
        self.claims = {}
        # Every change of a claim, as a watch sends it: (resourceVersion, type, the object).
        self.claim_events = []
        self.writes = []
        self.rejected = []
        self.refusals = []

    def stamp(self, obj, old=None):
        """Sets the server-owned metadata, as the object will have it if it is accepted."""
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.version + 1)
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta["generation"] = 1
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            meta["generation"] = old["metadata"].get("generation", 1) + (obj.get("spec") != old.get("spec"))
        return obj

    def commit(self, obj):
        """An accepted write: only these move the resourceVersion."""
        self.version += 1
        return obj

    def highest_generation(self, driver, pool, excluding=None):
        """The highest generation among the stored slices of a pool (None if it has none)."""
        generations = [s["spec"]["pool"].get("generation") or 0 for n, s in self.slices.items()
                       if n != excluding and s["spec"].get("driver") == driver
                       and s["spec"]["pool"].get("name") == pool]
        return max(generations, default=None)

    def admit_slice(self, obj):
        obj.setdefault("apiVersion", GROUP_VERSION)
        obj.setdefault("kind", "ResourceSlice")
        self.schemas.check("resourceslice-resource-v1.json", obj)
        # A PUT is compared with the slice it replaces too: lowering a pool's only slice counts.
        check_slice(obj, self.nodes, self.highest_generation)

    def admit_policy(self, operation, name, obj, old, user):
        """The --policy files' ValidatingAdmissionPolicies, on a ResourceSlice write that passed
        validation (a DELETE: once the slice is found)."""
        if self.policies is None:
            return
        kind = {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceSlice"}
        try:
            self.policies.admit(operation, kind, "resourceslices", name, obj, old, user)
        except vap.Denied as e:
            raise Refused(e.code, e.reason, e.message, e.details)

    def admit_claim_status_policy(self, namespace, name, obj, old, user):
        """The --policy files' ValidatingAdmissionPolicies, on an update of a ResourceClaim's
        status that passed validation."""
        if self.policies is None:
            return
        kind = {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}
        try:
            self.policies.admit("UPDATE", kind, "resourceclaims", name, obj, old, user,
                                namespace=namespace, subresource="status")
        except vap.Denied as e:
            raise Refused(e.code, e.reason, e.message, e.details)

    def admit_claim(self, obj):
        obj.setdefault("apiVersion", GROUP_VERSION)
        obj.setdefault("kind", "ResourceClaim")
        default_claim(obj)
        self.schemas.check("resourceclaim-resource-v1.json", obj)
        check_claim(obj)


def field_selector(query):
    """The field selector of a list or delete-collection, as (label, value, equal) triples."""
    raw = query.get("fieldSelector", [""])[0]
    terms = []
    for term in filter(None, (t.strip() for t in raw.split(","))):
        if "!=" in term:
            label, _, value = term.partition("!=")
            equal = False
        else:
            label, _, value = term.partition("=")
            value, equal = value[1:] if value.startswith("=") else value, True
        if label not in SLICE_FIELD_LABELS:
            raise Refused(400, "BadRequest", f'unable to parse requested fieldSelector "{raw}": '
                          f'field label not supported: {label}')
        terms.append((label, value, equal))
    return terms


def selected(obj, terms):
    spec = obj.get("spec", {})
    return all((str(spec.get(label.split(".", 1)[1]) or "") == value) == equal for label, value, equal in terms)


def status(code, reason, message, details=None):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    if details is not None:
        body["details"] = details
    return body


# The tests' own client (--admin-token): may do anything, as a cluster admin may.
ADMIN = {"username": "test-admin", "groups": ["system:masters", "system:authenticated"]}
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def user_info(username, node):
    """userInfo as kube-apiserver's service account authenticator makes it for a token bound
    to a pod on `node` (no node extra when `node` is empty)."""
    groups = ["system:authenticated"]
    parts = username.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}"] + groups
    return {"username": username, "groups": groups, "extra": {NODE_NAME_EXTRA: [node]} if node else {}}


def conflict(resource, name):
    return Refused(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {CONFLICT}')


def not_found(resource, name):
    return Refused(404, "NotFound", f'{resource} "{name}" not found')


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as kube clients expect; every reply has a length
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

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
            return raw
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def body(self):
        raw = self.request_body
        try:
            obj = json.loads(raw or b"{}")
        except ValueError as e:
            raise Refused(400, "BadRequest", f"the body is not JSON: {e}")
        if not isinstance(obj, dict):
            raise Refused(400, "BadRequest", "the body is not a JSON object")
        return obj

    def handle_any(self, method):
        # Read the whole body first, so that a refusal leaves the connection usable.
        self.request_body = self.read_body()
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query.lstrip("&"))
        path = url.path.rstrip("/")
        store = self.store
        try:
            self.user = self.authenticate(store)
            if method == "GET" and path == GROUP + "/resourceclaims" and query.get("watch", [""])[0] in ("true", "1"):
                return self.watch_claims(query, store)
            with store.lock:
                code, body, name = self.route(method, path, query, store)
                if method != "GET":
                    store.writes.append({"method": method, "path": path, "name": name, "time_ns": time.time_ns()})
                data = copy.deepcopy(body)
            self.reply(code, data)
        except (BrokenPipeError, ConnectionResetError):
            # The client went away before the answer (a driver stopped mid-call): nothing was
            # refused, and there is no one left to answer.
            pass
        except (Refused, Invalid) as e:
            code, reason, message = (e.code, e.reason, e.message) if isinstance(e, Refused) else (422, "Invalid", str(e))
            if method != "GET":
                with store.lock:
                    store.rejected.append({"method": method, "path": path, "code": code, "message": message})
            self.reply(code, status(code, reason, message, getattr(e, "details", None)))
        except Exception as e:  # A bug here must fail the test that met it, not hang it.
            message = f"stand-in API server error: {type(e).__name__}: {e}"
            sys.stderr.write(message + "\n")
            with store.lock:
                store.rejected.append({"method": method, "path": path, "code": 500, "message": message})
            self.reply(500, status(500, "InternalError", message))

    def watch_claims(self, query, store):
        """A watch of every namespace's claims from `resourceVersion`, as kube-apiserver streams
        it: one JSON event a line (ADDED, MODIFIED, DELETED with the object), chunked, until
        `timeoutSeconds` (at most 60 here). Every change is kept, so no version is too old."""
        since = int(query.get("resourceVersion", ["0"])[0] or 0)
        timeout = min(int(query.get("timeoutSeconds", ["60"])[0] or 60), 60)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(event):
            line = json.dumps(event).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                with store.lock:
                    new = [(v, t, copy.deepcopy(o)) for v, t, o in store.claim_events if v > since]
                for version, kind, obj in new:
                    send({"type": kind, "object": obj})
                    since = version
                time.sleep(0.02)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # The watcher closed it: a watch ends so.

    def authenticate(self, store):
        # No token is no user: the real server, anonymous requests off, answers 401 too.
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        user = store.users.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise Refused(401, "Unauthorized", "Unauthorized")
        return user

    def route(self, method, path, query, store):
        if path == "/_writes" and method == "GET":
            return 200, store.writes, None
        if path == "/_refuse" and method == "POST":
            store.refusals.append(self.body())
            return 200, {}, None
        for refusal in store.refusals:
            if refusal["count"] > 0 and refusal["method"] == method and path.endswith(refusal["suffix"]):
                refusal["count"] -= 1
                if refusal["code"] == 409:
                    raise Refused(409, "Conflict", f"injected by the test: {CONFLICT}")
                raise Refused(refusal["code"], "InternalError", "injected by the test: etcdserver: request timed out")
        if path == "/_rejected" and method == "GET":
            return 200, store.rejected, None
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)", path)
        if m:
            if method != "GET":
                raise Refused(405, "MethodNotAllowed", f"{method} is not supported on nodes here")
            node = store.nodes.get(m.group(1))
            if node is None:
                raise not_found("nodes", m.group(1))
            return 200, node, None
        if path == GROUP + "/resourceslices":
            return self.slices_collection(method, query, store)
        m = re.fullmatch(GROUP + r"/resourceslices/([^/]+)", path)
        if m:
            return self.one_slice(method, m.group(1), store)
        if path == GROUP + "/resourceclaims":
            # Every namespace's claims, as the scheduler's informer lists them: the allocated
            # ones are what its allocator counts as in use.
            if method != "GET":
                raise Refused(405, "MethodNotAllowed", f"{method} is not supported on resourceclaims here")
            return 200, {"apiVersion": GROUP_VERSION, "kind": "ResourceClaimList",
                         "metadata": {"resourceVersion": str(store.version)},
                         "items": list(store.claims.values())}, None
        m = re.fullmatch(GROUP + r"/namespaces/([^/]+)/resourceclaims", path)
        if m:
            return self.claims_collection(method, m.group(1), store)
        m = re.fullmatch(GROUP + r"/namespaces/([^/]+)/resourceclaims/([^/]+)(/status)?", path)
        if m:
            return self.one_claim(method, m.group(1), m.group(2), bool(m.group(3)), store)
        raise Refused(404, "NotFound", f"the server could not find the requested resource ({method} {path})")

    def slices_collection(self, method, query, store):
        if method == "GET":
            terms = field_selector(query)
            return 200, {"apiVersion": GROUP_VERSION, "kind": "ResourceSliceList",
                         "metadata": {"resourceVersion": str(store.version)},
                         "items": [s for s in store.slices.values() if selected(s, terms)]}, None
        if method == "POST":
            obj = self.body()
            meta = obj.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise Invalid("metadata: Invalid value: must be an object")
            # Server-owned: what a client sends there on create is not kept.
            for server_set in ("resourceVersion", "uid", "creationTimestamp", "generation"):
                meta.pop(server_set, None)
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            name = meta.get("name") or ""
            if name in store.slices:
                raise Refused(409, "AlreadyExists", f'resourceslices.resource.k8s.io "{name}" already exists')
            store.stamp(obj)
            store.admit_slice(obj)
            store.admit_policy("CREATE", name, obj, None, self.user)
            store.slices[name] = store.commit(obj)
            return 201, obj, name
        if method == "DELETE":
            terms = field_selector(query)
            # Each item is admitted as its own DELETE; as kube-apiserver does, the allowed ones
            # are deleted and the first refusal is the answer.
            gone, refusal = [], None
            for n, s in store.slices.items():
                if selected(s, terms):
                    try:
                        store.admit_policy("DELETE", n, None, s, self.user)
                        gone.append(n)
                    except Refused as e:
                        refusal = refusal or e
            deleted = [store.slices.pop(n) for n in gone]
            if deleted:
                store.commit(None)
            if refusal is not None:
                if deleted:
                    store.writes.append({"method": method, "path": GROUP + "/resourceslices", "name": ",".join(gone),
                                         "time_ns": time.time_ns()})
                raise refusal
            return 200, {"apiVersion": GROUP_VERSION, "kind": "ResourceSliceList",
                         "metadata": {"resourceVersion": str(store.version)}, "items": deleted}, ",".join(gone)
        raise Refused(405, "MethodNotAllowed", f"{method} is not supported on resourceslices")

    def one_slice(self, method, name, store):
        old = store.slices.get(name)
        if method == "GET":
            if old is None:
                raise not_found("resourceslices.resource.k8s.io", name)
            return 200, old, None
        if method == "PUT":
            obj = self.body()
            meta = obj.setdefault("metadata", {})
            if not isinstance(meta, dict) or meta.get("name") != name:
                got = meta.get("name") if isinstance(meta, dict) else None
                raise Refused(400, "BadRequest",
                              f"the name of the object ({got}) does not match the name on the URL ({name})")
            if old is None:
                raise not_found("resourceslices.resource.k8s.io", name)
            if meta.get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise conflict("resourceslices.resource.k8s.io", name)
            store.stamp(obj, old)
            store.admit_slice(obj)
            store.admit_policy("UPDATE", name, obj, old, self.user)
            store.slices[name] = store.commit(obj)
            return 200, obj, name
        if method == "DELETE":
            if old is None:
                raise not_found("resourceslices.resource.k8s.io", name)
            store.admit_policy("DELETE", name, None, old, self.user)
            del store.slices[name]
            store.commit(old)
            return 200, old, name
        raise Refused(405, "MethodNotAllowed", f"{method} is not supported on a resourceslice")

    def claims_collection(self, method, namespace, store):
        if method != "POST":
            raise Refused(405, "MethodNotAllowed", f"{method} is not supported on resourceclaims here")
        obj = self.body()
        obj.pop("status", None)  # The real server drops status on create too.
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise Invalid("metadata: Invalid value: must be an object")
        for server_set in ("resourceVersion", "uid", "creationTimestamp", "generation"):
            meta.pop(server_set, None)
        if meta.get("namespace") not in (None, "", namespace):
            raise Refused(400, "BadRequest", f"the namespace of the provided object ({meta['namespace']}) "
                          f"does not match the namespace sent on the request ({namespace})")
        meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        name = meta.get("name") or ""
        if (namespace, name) in store.claims:
            raise Refused(409, "AlreadyExists", f'resourceclaims.resource.k8s.io "{name}" already exists')
        store.stamp(obj)
        store.admit_claim(obj)
        store.claims[(namespace, name)] = store.commit(obj)
        store.claim_events.append((store.version, "ADDED", copy.deepcopy(obj)))
        return 201, obj, name

    def one_claim(self, method, namespace, name, status_subresource, store):
        key = (namespace, name)
        old = store.claims.get(key)
        served = {"GET": True, "PUT": status_subresource, "DELETE": not status_subresource}
        if not served.get(method):
            # Of the writes, only the scheduler's (status) and the tests' create and delete are served.
            raise Refused(405, "MethodNotAllowed", f"{method} is not supported on resourceclaims"
                          + ("/status" if status_subresource else "") + " here")
        if old is None:
            raise not_found("resourceclaims.resource.k8s.io", name)
        if method == "GET":
            return 200, old, None
        if method == "PUT":
            obj = self.body()
            meta = field(obj, "metadata")
            if meta.get("name") not in (None, name):
                raise Refused(400, "BadRequest",
                              f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})")
            if meta.get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise conflict("resourceclaims.resource.k8s.io", name)
            updated = copy.deepcopy(old)  # Only status is taken from the body.
            updated["status"] = obj.get("status")
            store.stamp(updated, old)
            store.admit_claim(updated)
            store.admit_claim_status_policy(namespace, name, updated, old, self.user)
            store.claims[key] = store.commit(updated)
            store.claim_events.append((store.version, "MODIFIED", copy.deepcopy(updated)))
            return 200, updated, name
        del store.claims[key]
        store.commit(old)
        # A deleted object's resourceVersion is the deletion's, as kube-apiserver sends it.
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(store.version)
        store.claim_events.append((store.version, "DELETED", gone))
        return 200, old, name

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
    parser.add_argument("--policy", action="append", default=[],
                        help="a manifest whose ValidatingAdmissionPolicies and bindings apply")
    parser.add_argument("--admin-token", required=True, help="the tests' own client's token: a cluster admin")
    parser.add_argument("--user", action="append", nargs=3, default=[], metavar=("TOKEN", "USERNAME", "NODE"),
                        help="a bearer token's user, with NODE as its node-name extra ('' for none)")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.schemas, "_definitions.json")):
        sys.exit(f"apiserver.py: {args.schemas}: no _definitions.json; run scripts/fetch-k8s-schemas")
    schemas = Schemas(args.schemas)
    policies = None
    if args.policy:
        global vap
        import vap as policy_module  # beside this file; needs cel-python only then
        vap = policy_module
        policies = vap.Policies(args.policy, schemas)
    users = {token: user_info(username, node) for token, username, node in args.user}
    users[args.admin_token] = ADMIN
    Handler.store = Store(schemas, args.node, users, policies)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
