#!/usr/bin/env bash
# Checks the stand-in API server of the DRA tests (tests/support/apiserver.py) against what
# kube-apiserver 1.36 answers: every endpoint with curl, a valid ResourceSlice and claim
# accepted, and each broken variant refused with the right code and field path; and
# k8s/dra.yaml's ValidatingAdmissionPolicy evaluated on the driver's service account's writes
# (its own node's slice allowed, any other node's refused with the policy's message, as
# kube-apiserver reports a denial). Exits non-zero at the first unexpected answer, printing it.
#
# Usage: tests/support/apiserver_selftest.sh [SCHEMA_DIR [CEL_PYTHON_DIR]]   (defaults:
# $VRAMGATE_K8S_SCHEMAS, else /var/cache/vramgate-tests/k8s-json-schema-1.36, as
# scripts/fetch-k8s-schemas puts them; $VRAMGATE_CEL_PYTHON, else
# /var/cache/vramgate-tests/cel-python-0.5.0, as scripts/fetch-cel-python puts it). $PYTHON
# picks the interpreter (default /usr/bin/python3), e.g. one from a venv with a newer jsonschema.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
schemas="${1:-${VRAMGATE_K8S_SCHEMAS:-/var/cache/vramgate-tests/k8s-json-schema-1.36}}"
cel="${2:-${VRAMGATE_CEL_PYTHON:-/var/cache/vramgate-tests/cel-python-0.5.0}}"
python="${PYTHON:-/usr/bin/python3}"
[ -f "$schemas/_definitions.json" ] || { echo "$0: no schemas in $schemas; run scripts/fetch-k8s-schemas" >&2; exit 2; }
[ -f "$cel/.complete" ] || { echo "$0: no cel-python in $cel; run scripts/fetch-cel-python" >&2; exit 2; }
export PYTHONPATH="$cel"
dra_user=system:serviceaccount:kube-system:vramgate-dra

work="$(mktemp -d)"
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The policy applies to the service accounts' writes only: the checks without TOKEN set are
# the admin's (the tests' own client's token).
admin=selftest-admin
"$python" "$here/apiserver.py" --schemas "$schemas" --admin-token "$admin" --node node-a --node node-b \
  --policy "$repo/k8s/dra.yaml" \
  --user dra-a "$dra_user" node-a --user dra-b "$dra_user" node-b --user dra-nowhere "$dra_user" '' \
  --user other-a system:serviceaccount:kube-system:other node-a \
  >"$work/stdout" 2>"$work/stderr" &
server_pid=$!
for _ in $(seq 100); do
  grep -q '^listening ' "$work/stdout" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/stderr" >&2; echo "$0: the server exited" >&2; exit 1; }
  sleep 0.1
done
[ "$(wc -l <"$work/stdout")" -eq 1 ] || { echo "$0: expected one line on stdout" >&2; exit 1; }
base="$(sed -n 's/^listening \(http:\/\/127\.0\.0\.1:[0-9]*\)$/\1/p' "$work/stdout")"
[ -n "$base" ] || { echo "$0: bad first line: $(cat "$work/stdout")" >&2; exit 1; }

checks=0
method= path= code= body=
accepted_writes=0
rejected_writes=0
fail() {
  echo "FAIL: $*" >&2
  echo "  last request: $method $path" >&2
  echo "  answer ($code): $body" >&2
  echo "  server log (tail):" >&2
  tail -n 5 "$work/stderr" >&2
  exit 1
}

# request METHOD PATH [BODY]: sets $code and $body; counts writes as the server should. As
# the admin, or with $TOKEN set, as that --user (NOTOKEN=1: no Authorization header at all).
request() {
  method="$1" path="$2"
  local data=() auth=()
  [ $# -ge 3 ] && data=(-H 'Content-Type: application/json' --data-binary "$3")
  [ -z "${NOTOKEN:-}" ] && auth=(-H "Authorization: Bearer ${TOKEN:-$admin}")
  code="$(curl -sS -o "$work/body" -w '%{http_code}' -X "$method" "${data[@]}" "${auth[@]}" "$base$path")"
  body="$(cat "$work/body")"
  if [ "$method" != GET ]; then
    case "$code" in 2??) accepted_writes=$((accepted_writes + 1)) ;; *) rejected_writes=$((rejected_writes + 1)) ;; esac
  fi
}

expect_code() {
  checks=$((checks + 1))
  [ "$code" = "$1" ] || fail "expected HTTP $1"
}

# check PYTHON_EXPRESSION DESCRIPTION [ARG...]: the expression, on the answer's JSON `b` (with
# the ARGs as sys.argv[2:]), must be true.
check() {
  checks=$((checks + 1))
  local expression="$1" description="$2"
  shift 2
  BODY="$body" "$python" -c '
import json, os, re, sys
b = json.loads(os.environ["BODY"])
sys.exit(0 if eval(sys.argv[1]) else 1)' "$expression" "$@" || fail "$description [$expression]"
}
# expect_status CODE REASON [TEXT]: a Status of failure, whose message contains TEXT.
expect_status() {
  expect_code "$1"
  check "b['kind'] == 'Status' and b['apiVersion'] == 'v1' and b['status'] == 'Failure' \
and b['code'] == $1 and b['reason'] == '$2' and b['metadata'] == {}" "a Status $1 $2"
  [ $# -lt 3 ] || check "sys.argv[2] in b['message']" "message says: $3" "$3"
}

# The valid objects of the brief; variants are made from them with Python statements.
valid_slice='{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice",
 "metadata":{"name":"node-a-gpu-memory.vramgate.dev"},
 "spec":{"driver":"gpu-memory.vramgate.dev","nodeName":"node-a",
  "pool":{"name":"node-a","generation":1,"resourceSliceCount":1},
  "devices":[{"name":"gpu-0","allowMultipleAllocations":true,
    "attributes":{"uuid":{"string":"GPU-5f1c1d0e-8a9b-4c1d-9e2f-0123456789ab"},"index":{"int":0},"mig":{"bool":false}},
    "capacity":{"memory":{"value":"79Gi","requestPolicy":{"default":"1Gi","validRange":{"min":"256Mi","max":"79Gi","step":"256Mi"}}}}}]}}'
valid_claim='{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"trainer-gpu","namespace":"default"},
 "spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu-memory.vramgate.dev","capacity":{"requests":{"memory":"6Gi"}}}}]}}}'
valid_status='{"allocation":{"devices":{"results":[{"request":"gpu","driver":"gpu-memory.vramgate.dev","pool":"node-a","device":"gpu-0","shareID":"9a0c6a1e-5e2b-4c7f-8d3a-1b2c3d4e5f60","consumedCapacity":{"memory":"6Gi"}}]},"nodeSelector":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-a"]}]}]}}}'

# slice_variant NAME STATEMENTS: the valid slice named NAME, alone in a pool of its own (so
# that no other rule than the one broken applies), after STATEMENTS on `s` (the slice),
# `d` (its device), `mem` (its memory capacity), `rp` (its request policy), `vr` (its range).
slice_variant() {
  VALID="$valid_slice" "$python" -c '
import json, os, sys
s = json.loads(os.environ["VALID"])
s["metadata"]["name"] = s["spec"]["pool"]["name"] = sys.argv[1]
d = s["spec"]["devices"][0]
mem = d["capacity"]["memory"]
rp = mem["requestPolicy"]
vr = rp["validRange"]
exec(sys.argv[2])
print(json.dumps(s))' "$1" "$2"
}

# json_with JSON STATEMENTS: JSON (as `o`) after STATEMENTS.
json_with() {
  J="$1" "$python" -c '
import json, os, sys
o = json.loads(os.environ["J"])
exec(sys.argv[1])
print(json.dumps(o))' "$2"
}

# refused_slice NAME FIELD_PATH STATEMENTS [TEXT]: the variant is a 422 Invalid whose message
# is one error, at FIELD_PATH (and says TEXT); with SEVERAL_ERRORS=1, one of its errors.
refused_slice() {
  request POST /apis/resource.k8s.io/v1/resourceslices "$(slice_variant "$1" "$3")"
  expect_status 422 Invalid
  if [ -n "${SEVERAL_ERRORS:-}" ]; then
    check "any(e.startswith(sys.argv[2] + ': ') for e in b['message'].split('; '))" "$1: an error at $2" "$2"
  else
    check "b['message'].startswith(sys.argv[2] + ': ') and '; ' not in b['message']" "$1: one error, at $2" "$2"
  fi
  [ $# -lt 4 ] || check "sys.argv[2] in b['message']" "$1: says $4" "$4"
}

# accepted_slice NAME STATEMENTS: the variant is created.
accepted_slice() {
  request POST /apis/resource.k8s.io/v1/resourceslices "$(slice_variant "$1" "$2")"
  expect_code 201
}

slices=/apis/resource.k8s.io/v1/resourceslices
claims=/apis/resource.k8s.io/v1/namespaces/default/resourceclaims

echo "== quantities"
checks=$((checks + 1))
PYTHONPATH="$here" "$python" -c '
import fractions
from apiserver import quantity, ceil_value, Invalid
cases = {"79Gi": 79 * 2**30, "256Mi": 256 * 2**20, "1Ki": 1024, "1k": 1000, "1": 1, "1.5Gi": 3 * 2**29,
         "8e9": 8 * 10**9, "8E3": 8000, "1E": 10**18, "2Ei": 2 * 2**60, "500m": fractions.Fraction(1, 2),
         "+.5": fractions.Fraction(1, 2), "-1M": -10**6, "100n": fractions.Fraction(1, 10**7), "3u": fractions.Fraction(3, 10**6),
         "1.": 1, "0": 0, "12e-1": fractions.Fraction(6, 5), "7": 7}
for text, want in cases.items():
    assert quantity(text, "x") == want, (text, quantity(text, "x"), want)
assert ceil_value(quantity("500m", "x")) == 1 and ceil_value(quantity("1.5", "x")) == 2
assert ceil_value(quantity("-500m", "x")) == 0 and ceil_value(quantity("2", "x")) == 2
for bad in ("", "Gi", "1 Gi", "1gi", "1KB", "abc", "1.2.3", "--1", "1e", "0x10", "1Gi ", True, None):
    try:
        quantity(bad, "x")
    except Invalid:
        continue
    raise AssertionError(f"{bad!r} accepted")
' || fail "quantity parser"

echo "== keep-alive and request log"
checks=$((checks + 1))
curl -sS -v -H "Authorization: Bearer $admin" "$base/api/v1/nodes/node-a" "$base/api/v1/nodes/node-b" -o /dev/null -o /dev/null 2>"$work/curl-v" >/dev/null
grep -qiE 're-?using existing connection' "$work/curl-v" || { cat "$work/curl-v" >&2; fail "the connection was not kept alive"; }
grep -qi '^< Content-Length: ' "$work/curl-v" || fail "no Content-Length"
checks=$((checks + 1))
[ "$(grep -c '"GET /api/v1/nodes/node-' "$work/stderr")" -eq 2 ] || fail "each request logged as one line on stderr"

echo "== nodes"
request GET /api/v1/nodes/node-a
expect_code 200
check "b['apiVersion'] == 'v1' and b['kind'] == 'Node' and b['metadata']['name'] == 'node-a' \
and b['metadata']['uid'] and b['metadata']['resourceVersion'].isdigit()" "a Node"
request GET /api/v1/nodes/node-b
expect_code 200
request GET /api/v1/nodes/node-z
expect_status 404 NotFound 'nodes "node-z" not found'

echo "== resourceslices: create, read, list"
request POST "$slices?fieldManager=vramgate-dra" "$valid_slice"
expect_code 201
check "b['apiVersion'] == 'resource.k8s.io/v1' and b['kind'] == 'ResourceSlice' \
and b['metadata']['name'] == 'node-a-gpu-memory.vramgate.dev' and b['metadata']['generation'] == 1 \
and re.fullmatch(r'[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}', b['metadata']['uid']) \
and re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ', b['metadata']['creationTimestamp']) \
and b['metadata']['resourceVersion'].isdigit()" "server-set metadata"
first_uid="$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["uid"])' "$body")"
first_created="$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["creationTimestamp"])' "$body")"
first_version="$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["resourceVersion"])' "$body")"
request POST "$slices" "$valid_slice"
expect_status 409 AlreadyExists 'resourceslices.resource.k8s.io "node-a-gpu-memory.vramgate.dev" already exists'
request GET "$slices/node-a-gpu-memory.vramgate.dev"
expect_code 200
check "b['metadata']['uid'] == sys.argv[2] and b['spec']['devices'][0]['capacity']['memory']['value'] == '79Gi'" \
  "the stored slice" "$first_uid"
request GET "$slices/absent"
expect_status 404 NotFound 'resourceslices.resource.k8s.io "absent" not found'
# One on node-b under another driver, for the selectors.
other="$(json_with "$valid_slice" 'o["metadata"]["name"] = "node-b-other"; o["spec"]["driver"] = "other.example.com"; o["spec"]["nodeName"] = "node-b"; o["spec"]["pool"]["name"] = "node-b"')"
request POST "$slices" "$other"
expect_code 201
request GET "$slices"
expect_code 200
check "b['apiVersion'] == 'resource.k8s.io/v1' and b['kind'] == 'ResourceSliceList' \
and b['metadata']['resourceVersion'].isdigit() and len(b['items']) == 2" "a list of both"
request GET "$slices?&fieldSelector=spec.nodeName%3Dnode-a&limit=500&timeout=10s&labelSelector=x%3Dy"
expect_code 200
check "[i['metadata']['name'] for i in b['items']] == ['node-a-gpu-memory.vramgate.dev']" "selected by node"
request GET "$slices?fieldSelector=spec.driver%3Dother.example.com%2Cspec.nodeName%3Dnode-b"
expect_code 200
check "[i['metadata']['name'] for i in b['items']] == ['node-b-other']" "selected by driver and node"
request GET "$slices?fieldSelector=spec.driver%3D%3Dgpu-memory.vramgate.dev%2Cspec.nodeName%21%3Dnode-b"
expect_code 200
check "[i['metadata']['name'] for i in b['items']] == ['node-a-gpu-memory.vramgate.dev']" "== and !="
request GET "$slices?fieldSelector=spec.nodeName%3Dnode-z"
expect_code 200
check "b['items'] == []" "nothing selected"
request GET "$slices?fieldSelector=spec.pool.name%3Dnode-a"
expect_status 400 BadRequest 'field label not supported: spec.pool.name'
request GET "$slices?fieldSelector=spec.driver%3Dx%2Cmetadata.name%3Dy"
expect_status 400 BadRequest 'field label not supported: metadata.name'

echo "== resourceslices: generateName"
named="$(json_with "$valid_slice" 'del o["metadata"]["name"]; o["metadata"]["generateName"] = "node-a-gpu-memory.vramgate.dev-"; o["metadata"]["resourceVersion"] = "999"; o["spec"]["pool"]["name"] = "generated"')"
request POST "$slices" "$named"
expect_code 201
check "re.fullmatch(r'node-a-gpu-memory\.vramgate\.dev-[a-z0-9]{5}', b['metadata']['name']) \
and b['metadata']['resourceVersion'] != '999'" "a generated name; the body's resourceVersion ignored"
generated="$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["name"])' "$body")"
request GET "$slices/$generated"
expect_code 200

echo "== resourceslices: replace"
update="$(json_with "$valid_slice" 'o["spec"]["pool"]["generation"] = 2; o["spec"]["devices"][0]["attributes"]["index"] = {"int": 1}')"
with_version() { json_with "$1" "o['metadata']['resourceVersion'] = '$2'"; }
request PUT "$slices/node-a-gpu-memory.vramgate.dev?fieldManager=vramgate-dra" "$update"
expect_status 409 Conflict "the object has been modified; please apply your changes to the latest version and try again"
request PUT "$slices/node-a-gpu-memory.vramgate.dev" "$(with_version "$update" 1)"
expect_status 409 Conflict "the object has been modified; please apply your changes to the latest version and try again"
request PUT "$slices/another-name" "$(with_version "$update" "$first_version")"
expect_status 400 BadRequest "does not match the name on the URL"
absent="$(json_with "$update" 'o["metadata"]["name"] = "absent"; o["metadata"]["resourceVersion"] = "1"')"
request PUT "$slices/absent" "$absent"
expect_status 404 NotFound 'resourceslices.resource.k8s.io "absent" not found'
broken_update="$(json_with "$(with_version "$update" "$first_version")" 'o["spec"]["devices"][0]["name"] = "GPU-0"')"
request PUT "$slices/node-a-gpu-memory.vramgate.dev" "$broken_update"
expect_status 422 Invalid "spec.devices[0].name: "
request PUT "$slices/node-a-gpu-memory.vramgate.dev" "$(with_version "$update" "$first_version")"
expect_code 200
check "b['metadata']['uid'] == sys.argv[2] and b['metadata']['creationTimestamp'] == sys.argv[3] \
and int(b['metadata']['resourceVersion']) > int(sys.argv[4]) and b['metadata']['generation'] == 2 \
and b['spec']['pool']['generation'] == 2 and b['kind'] == 'ResourceSlice'" \
  "replaced: same uid and creationTimestamp, newer resourceVersion" "$first_uid" "$first_created" "$first_version"
second_version="$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["resourceVersion"])' "$body")"
request GET "$slices/node-a-gpu-memory.vramgate.dev"
check "b['metadata']['resourceVersion'] == sys.argv[2] and b['spec']['devices'][0]['attributes']['index'] == {'int': 1}" \
  "the replacement is stored" "$second_version"

echo "== resourceslices: a pool's generation never goes down (the stand-in's own rule)"
older="$(json_with "$valid_slice" 'o["metadata"]["name"] = "node-a-second"')"
request POST "$slices" "$older"
expect_status 422 Invalid "spec.pool.generation: Invalid value: 1: lower than 2, the pool's newest"
request PUT "$slices/node-a-gpu-memory.vramgate.dev" "$(with_version "$valid_slice" "$second_version")"
expect_status 422 Invalid "spec.pool.generation: Invalid value: 1: lower than 2"
same="$(json_with "$older" 'o["spec"]["pool"]["generation"] = 2; o["spec"]["pool"]["resourceSliceCount"] = 2; o["spec"]["devices"][0]["name"] = "gpu-1"')"
request POST "$slices" "$same"
expect_code 201

echo "== resourceslices: the schema (strict: unknown fields, types, apiVersion and kind)"
refused_slice misspelt 'spec.devices[0].capacity.memory.requestPolicy.validRange.stepp' \
  'vr["stepp"] = "1Mi"' "Additional properties are not allowed ('stepp' was unexpected)"
refused_slice unknown-top 'spec.color' 's["spec"]["color"] = "red"' "Additional properties are not allowed"
refused_slice wrong-type 'spec.pool.generation' 's["spec"]["pool"]["generation"] = "1"' "is not of type 'integer'"
refused_slice wrong-api-version 'apiVersion' 's["apiVersion"] = "resource.k8s.io/v1beta2"'
refused_slice wrong-kind 'kind' 's["kind"] = "ResourceClaim"'
refused_slice no-driver 'spec' 'del s["spec"]["driver"]' "'driver' is a required property"
refused_slice bad-metadata 'metadata.labelz' 's["metadata"]["labelz"] = {}'

echo "== resourceslices: names and pool"
request POST "$slices" "$(json_with "$valid_slice" 'o["metadata"]["name"] = "Capital"; o["spec"]["pool"]["name"] = "capital"')"
expect_status 422 Invalid "metadata.name: Invalid value: 'Capital'"
request POST "$slices" "$(json_with "$valid_slice" 'o["metadata"]["name"] = "a" * 254; o["spec"]["pool"]["name"] = "long-name"')"
expect_status 422 Invalid "metadata.name: "
accepted_slice "$(printf 'a%.0s' $(seq 253))" ''
refused_slice bad-driver 'spec.driver' 's["spec"]["driver"] = "GPU_memory.vramgate.dev"'
refused_slice long-driver 'spec.driver' 's["spec"]["driver"] = "a" * 64'
refused_slice empty-pool 'spec.pool.name' 's["spec"]["pool"]["name"] = ""' "Required value"
refused_slice negative-generation 'spec.pool.generation' 's["spec"]["pool"]["generation"] = -1' "greater than or equal to 0"
refused_slice no-slices 'spec.pool.resourceSliceCount' 's["spec"]["pool"]["resourceSliceCount"] = 0' "greater than 0"

echo "== resourceslices: exactly one node selection, of a known node"
refused_slice no-node 'spec' 'del s["spec"]["nodeName"]' "exactly one of"
refused_slice two-nodes 'spec' 's["spec"]["allNodes"] = True' "exactly one of"
refused_slice all-and-per-device 'spec' 'del s["spec"]["nodeName"]; s["spec"]["allNodes"] = True; s["spec"]["perDeviceNodeSelection"] = True' "exactly one of"
refused_slice name-and-selector 'spec' 's["spec"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}' "exactly one of"
refused_slice stranger 'spec.nodeName' 's["spec"]["nodeName"] = "node-z"' "no such node"
accepted_slice all-nodes 'del s["spec"]["nodeName"]; s["spec"]["allNodes"] = True; s["spec"]["perDeviceNodeSelection"] = False'
accepted_slice node-selector 'del s["spec"]["nodeName"]; s["spec"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}'
accepted_slice on-node-b 's["spec"]["nodeName"] = "node-b"'

echo "== resourceslices: devices"
refused_slice too-many-devices 'spec.devices' 's["spec"]["devices"] = [dict(d, name=f"gpu-{i}") for i in range(129)]' "Too many: 129"
accepted_slice max-devices 's["spec"]["devices"] = [dict(d, name=f"gpu-{i}") for i in range(128)]'
refused_slice underscore 'spec.devices[0].name' 'd["name"] = "gpu_0"'
refused_slice dash-first 'spec.devices[0].name' 'd["name"] = "-gpu"'
refused_slice dotted-device 'spec.devices[0].name' 'd["name"] = "gpu.0"'
refused_slice long-device 'spec.devices[0].name' 'd["name"] = "g" * 64'
refused_slice same-device 'spec.devices[1].name' 's["spec"]["devices"].append(dict(d))' "Duplicate value: 'gpu-0'"
refused_slice too-many-attributes 'spec.devices[0]' 'd["attributes"].update({f"a{i}": {"int": i} for i in range(29)})' "Too many: 33"
accepted_slice max-attributes 'd["attributes"].update({f"a{i}": {"int": i} for i in range(28)})'
refused_slice digit-attribute 'spec.devices[0].attributes[1index]' 'd["attributes"]["1index"] = {"int": 1}' "C identifier"
refused_slice long-attribute "spec.devices[0].attributes[$(printf 'a%.0s' $(seq 33))]" 'd["attributes"]["a" * 33] = {"int": 1}' "C identifier"
refused_slice bad-domain 'spec.devices[0].attributes[Bad_Domain/index]' 'd["attributes"]["Bad_Domain/index"] = {"int": 1}' "DNS subdomain"
refused_slice two-slashes 'spec.devices[0].attributes[a.b/c/d]' 'd["attributes"]["a.b/c/d"] = {"int": 1}'
accepted_slice qualified 'd["attributes"]["gpu-memory.vramgate.dev/index_2"] = {"int": 1}; d["attributes"]["A" * 32] = {"version": "1.2.3"}'
refused_slice two-values 'spec.devices[0].attributes[index]' 'd["attributes"]["index"] = {"int": 0, "bool": True}' "exactly one value"
refused_slice no-value 'spec.devices[0].attributes[index]' 'd["attributes"]["index"] = {}' "exactly one value"
refused_slice long-string 'spec.devices[0].attributes[uuid].string' 'd["attributes"]["uuid"] = {"string": "x" * 65}' "may not be more than 64"
refused_slice long-version 'spec.devices[0].attributes[driver].version' 'd["attributes"]["driver"] = {"version": "1." + "0" * 63}' "may not be more than 64"
accepted_slice string-64 'd["attributes"]["uuid"] = {"string": "x" * 64}'
refused_slice bad-capacity-name 'spec.devices[0].capacity[mem-ory]' 'd["capacity"]["mem-ory"] = {"value": "1"}' "C identifier"
refused_slice bad-quantity 'spec.devices[0].capacity[memory].value' 'mem["value"] = "79 Gi"' "quantities must match"
refused_slice lower-gi 'spec.devices[0].capacity[memory].value' 'mem["value"] = "79gi"' "quantities must match"

echo "== resourceslices: consumable capacity"
refused_slice not-shared 'spec.devices[0].capacity[memory].requestPolicy' 'd["allowMultipleAllocations"] = False' "allowMultipleAllocations must be true"
refused_slice unshared 'spec.devices[0].capacity[memory].requestPolicy' 'del d["allowMultipleAllocations"]' "Forbidden"
accepted_slice unshared-plain 'del d["allowMultipleAllocations"]; del mem["requestPolicy"]'
accepted_slice default-alone 'mem["requestPolicy"] = {"default": "1Gi"}'
accepted_slice no-step 'del vr["step"]; rp["default"] = "1000Mi"'
accepted_slice no-max 'del vr["max"]'
accepted_slice decimal-units 'mem["value"] = "84825604096"; vr["max"] = "84825604096"; vr["min"] = "268435456"; rp["default"] = "1073741824"'
refused_slice range-and-values 'spec.devices[0].capacity[memory].requestPolicy' 'rp["validValues"] = ["1Gi"]' "exactly one policy"
refused_slice range-no-default 'spec.devices[0].capacity[memory].requestPolicy.default' 'del rp["default"]' "required when validRange is defined"
refused_slice values-no-default 'spec.devices[0].capacity[memory].requestPolicy.default' 'del rp["default"]; del rp["validRange"]; rp["validValues"] = ["1Gi"]' "required when validValues is defined"
# The schema requires min already (its path names map keys as fields, kube's as [key]).
refused_slice no-min 'spec.devices[0].capacity.memory.requestPolicy.validRange' 'del vr["min"]' "'min' is a required property"
refused_slice min-over 'spec.devices[0].capacity[memory].requestPolicy.validRange.min' 'vr["min"] = "80Gi"; del vr["max"]; del vr["step"]; rp["default"] = "80Gi"' "min is larger than capacity value"
refused_slice default-under 'spec.devices[0].capacity[memory].requestPolicy.validRange.min' 'rp["default"] = "128Mi"; del vr["step"]' "default is less than min"
# A default can't be both at least min and at most max here: kube-apiserver says both too.
SEVERAL_ERRORS=1 refused_slice min-over-max 'spec.devices[0].capacity[memory].requestPolicy.validRange.max' 'vr["min"] = "512Mi"; vr["max"] = "256Mi"; rp["default"] = "512Mi"; del vr["step"]' "min is larger than max"
refused_slice over 'spec.devices[0].capacity[memory].requestPolicy.validRange.max' 'vr["max"] = "80Gi"' "max is larger than capacity value"
refused_slice default-over 'spec.devices[0].capacity[memory].requestPolicy.validRange.max' 'vr["max"] = "512Mi"; rp["default"] = "768Mi"' "default is more than max"
refused_slice no-room 'spec.devices[0].capacity[memory].requestPolicy.validRange.step' 'mem["value"] = "300Mi"; vr["max"] = "256Mi"; rp["default"] = "256Mi"' "one step is larger than capacity value"
accepted_slice just-room 'mem["value"] = "512Mi"; vr["max"] = "512Mi"; rp["default"] = "512Mi"'
refused_slice off-step 'spec.devices[0].capacity[memory].requestPolicy.validRange.step' 'rp["default"] = "1100Mi"' "default is not a multiple of a given step"
refused_slice max-off-step 'spec.devices[0].capacity[memory].requestPolicy.validRange.step' 'vr["max"] = "78.9Gi"' "max is not a multiple of a given step"
accepted_slice step-from-min 'vr["min"] = "100Mi"; vr["max"] = "79Gi"; vr["step"] = "1Mi"; rp["default"] = "101Mi"'
refused_slice step-from-min-off 'spec.devices[0].capacity[memory].requestPolicy.validRange.step' 'vr["min"] = "100Mi"; vr["max"] = "356Mi"; rp["default"] = "256Mi"' "default is not a multiple"
values='del rp["validRange"]; rp["validValues"] = ["1Gi", "2Gi", "4Gi"]; rp["default"] = "2Gi"'
accepted_slice valid-values "$values"
accepted_slice valid-values-same-number "$values; rp[\"default\"] = \"2147483648\""
refused_slice too-many-values 'spec.devices[0].capacity[memory].requestPolicy.validValues' "$values; rp[\"validValues\"] = [f\"{i}Gi\" for i in range(1, 12)]" "Too many: 11"
accepted_slice ten-values "$values; rp[\"validValues\"] = [f\"{i}Gi\" for i in range(1, 11)]"
refused_slice unsorted 'spec.devices[0].capacity[memory].requestPolicy.validValues[1]' "$values; rp[\"validValues\"] = [\"2Gi\", \"1Gi\"]" "sorted in ascending order"
refused_slice duplicate-values 'spec.devices[0].capacity[memory].requestPolicy.validValues[1]' "$values; rp[\"validValues\"] = [\"1Gi\", \"1073741824\"]; rp[\"default\"] = \"1Gi\"" "Duplicate value"
refused_slice value-over 'spec.devices[0].capacity[memory].requestPolicy.validValues[2]' "$values; rp[\"validValues\"] = [\"1Gi\", \"2Gi\", \"80Gi\"]" "option is larger than capacity value"
refused_slice default-not-a-value 'spec.devices[0].capacity[memory].requestPolicy.validValues' "$values; rp[\"default\"] = \"3Gi\"" "default value is not valid according to the requestPolicy"

echo "== resourceslices: delete"
request DELETE "$slices/node-a-second"
expect_code 200
check "b['metadata']['name'] == 'node-a-second' and b['kind'] == 'ResourceSlice'" "the deleted slice"
request DELETE "$slices/node-a-second"
expect_status 404 NotFound
request DELETE "$slices?fieldSelector=spec.pool.name%3Dnode-a"
expect_status 400 BadRequest 'field label not supported: spec.pool.name'
request GET "$slices/node-b-other"
expect_code 200
request DELETE "$slices?fieldSelector=spec.driver%3Dother.example.com"
expect_code 200
check "b['kind'] == 'ResourceSliceList' and [i['metadata']['name'] for i in b['items']] == ['node-b-other']" "the deleted list"
request GET "$slices/node-b-other"
expect_status 404 NotFound
request GET "$slices?fieldSelector=spec.driver%3Dgpu-memory.vramgate.dev"
check "len(b['items']) > 1" "the other driver's slices remain"
request DELETE "$slices?fieldSelector=spec.driver%3Dgpu-memory.vramgate.dev"
expect_code 200
request GET "$slices"
check "b['items'] == []" "all deleted"
# With the pool gone, its generation may start again (consumers hold nothing of it).
request POST "$slices" "$valid_slice"
expect_code 201

echo "== resourceslices: other methods and bodies"
request PATCH "$slices/node-a-gpu-memory.vramgate.dev" '{}'
expect_status 405 MethodNotAllowed
request PUT "$slices" "$valid_slice"
expect_status 405 MethodNotAllowed
request POST "$slices" '{"apiVersion": '
expect_status 400 BadRequest "not JSON"
request POST "$slices" '[]'
expect_status 400 BadRequest "not a JSON object"
request GET /apis/resource.k8s.io/v1beta2/resourceslices
expect_status 404 NotFound

echo "== ValidatingAdmissionPolicy of k8s/dra.yaml: the driver writes only its own node's slice"
# pslice NAME NODE [STATEMENTS]: the valid slice as NAME on NODE, in NODE's pool (as the
# driver names it).
pslice() {
  json_with "$valid_slice" "o['metadata']['name'] = '$1'; o['spec']['nodeName'] = o['spec']['pool']['name'] = '$2'; ${3:-pass}"
}
version_of() { "$python" -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["resourceVersion"])' "$body"; }
# expect_denied NAME TEXT: the Status kube-apiserver answers for a denial of the policy with
# reason Forbidden, naming the slice, whose message ends with TEXT.
denial_prefix="ValidatingAdmissionPolicy 'vramgate-dra-slices' with binding 'vramgate-dra-slices' denied request: "
expect_denied() {
  expect_status 403 Forbidden
  check "b['message'] == 'resourceslices.resource.k8s.io \"' + sys.argv[2] + '\" is forbidden: ' + sys.argv[3] + sys.argv[4] \
and b['details'] == {'name': sys.argv[2], 'group': 'resource.k8s.io', 'kind': 'resourceslices', \
'causes': [{'message': sys.argv[3] + sys.argv[4]}]}" "denied by the policy: $2" "$1" "$denial_prefix" "$2"
}
not_yours() { echo "vramgate-dra on node '$1' may write only its own node's ResourceSlices, not $2"; }
not_its_driver() { echo "vramgate-dra may write only ResourceSlices whose spec.driver is gpu-memory.vramgate.dev, not one of driver '$1'"; }
not_its_pool() { echo "vramgate-dra on node '$1' may write only ResourceSlices whose spec.pool.name is its node's name '$1', not one of pool '$2'"; }
no_node="vramgate-dra may write only its own node's ResourceSlices, and this request does not say which node it comes from: it needs the service account token of a pod on the node (kubelet's projected token, whose user extra authentication.kubernetes.io/node-name is the node: Kubernetes 1.30 or later with ServiceAccountTokenPodNodeInfo, GA in 1.32)"

# Its own node: create, replace, delete.
TOKEN=dra-a request POST "$slices" "$(pslice vap-own node-a)"
expect_code 201
TOKEN=dra-a request PUT "$slices/vap-own" "$(pslice vap-own node-a "o['metadata']['resourceVersion'] = '$(version_of)'; o['spec']['pool']['generation'] = 2")"
expect_code 200
check "b['spec']['pool']['generation'] == 2" "replaced"
TOKEN=dra-a request DELETE "$slices/vap-own"
expect_code 200
# On its own node, but naming node-b's pool (which would outrank node-b's own slice at a
# higher generation) or another driver: not created.
TOKEN=dra-a request POST "$slices" "$(pslice vap-pool node-a "o['spec']['pool']['name'] = 'node-b'; o['spec']['pool']['generation'] = 9")"
expect_denied vap-pool "$(not_its_pool node-a node-b)"
TOKEN=dra-a request POST "$slices" "$(pslice vap-driver node-a "o['spec']['driver'] = 'other.example.com'")"
expect_denied vap-driver "$(not_its_driver other.example.com)"
# Its own slice moved to node-b's pool, or to another driver: not replaced.
TOKEN=dra-a request POST "$slices" "$(pslice vap-own node-a)"
expect_code 201
own_version="$(version_of)"
TOKEN=dra-a request PUT "$slices/vap-own" "$(pslice vap-own node-a "o['metadata']['resourceVersion'] = '$own_version'; o['spec']['pool']['name'] = 'node-b'")"
expect_denied vap-own "$(not_its_pool node-a node-b)"
TOKEN=dra-a request PUT "$slices/vap-own" "$(pslice vap-own node-a "o['metadata']['resourceVersion'] = '$own_version'; o['spec']['driver'] = 'other.example.com'")"
expect_denied vap-own "$(not_its_driver other.example.com)"
TOKEN=dra-a request DELETE "$slices/vap-own"
expect_code 200
# Such slices on its node (the admin's): neither moved into its pool or driver, nor deleted.
request POST "$slices" "$(pslice vap-pool node-a "o['spec']['pool']['name'] = 'node-b'")"
expect_code 201
pool_version="$(version_of)"
TOKEN=dra-a request PUT "$slices/vap-pool" "$(pslice vap-pool node-a "o['metadata']['resourceVersion'] = '$pool_version'")"
expect_denied vap-pool "$(not_its_pool node-a node-b)"
TOKEN=dra-a request DELETE "$slices/vap-pool"
expect_denied vap-pool "$(not_its_pool node-a node-b)"
request POST "$slices" "$(pslice vap-driver node-a "o['spec']['driver'] = 'other.example.com'")"
expect_code 201
driver_version="$(version_of)"
TOKEN=dra-a request PUT "$slices/vap-driver" "$(pslice vap-driver node-a "o['metadata']['resourceVersion'] = '$driver_version'")"
expect_denied vap-driver "$(not_its_driver other.example.com)"
TOKEN=dra-a request DELETE "$slices/vap-driver"
expect_denied vap-driver "$(not_its_driver other.example.com)"
request GET "$slices/vap-pool"
check "b['metadata']['resourceVersion'] == sys.argv[2] and b['spec']['pool']['name'] == 'node-b'" "the admin's slice of node-b's pool unchanged" "$pool_version"
request GET "$slices/vap-driver"
check "b['metadata']['resourceVersion'] == sys.argv[2] and b['spec']['driver'] == 'other.example.com'" "the admin's slice of another driver unchanged" "$driver_version"
request DELETE "$slices/vap-pool"
expect_code 200
request DELETE "$slices/vap-driver"
expect_code 200
# Another node's: not created, and the one there (written by the admin) neither replaced nor
# deleted; node-b's driver may.
TOKEN=dra-a request POST "$slices" "$(pslice vap-b node-b)"
expect_denied vap-b "$(not_yours node-a "one of node 'node-b'")"
request POST "$slices" "$(pslice vap-b node-b)"
expect_code 201
b_version="$(version_of)"
TOKEN=dra-a request PUT "$slices/vap-b" "$(pslice vap-b node-b "o['metadata']['resourceVersion'] = '$b_version'; o['spec']['pool']['generation'] = 2")"
expect_denied vap-b "$(not_yours node-a "one of node 'node-b'")"
# Moved to the caller's node, it is still the other node's slice that is replaced.
TOKEN=dra-a request PUT "$slices/vap-b" "$(pslice vap-b node-a "o['metadata']['resourceVersion'] = '$b_version'")"
expect_denied vap-b "$(not_yours node-a "one of node 'node-b'")"
TOKEN=dra-a request DELETE "$slices/vap-b"
expect_denied vap-b "$(not_yours node-a "one of node 'node-b'")"
request GET "$slices/vap-b"
check "b['metadata']['resourceVersion'] == sys.argv[2] and b['spec']['nodeName'] == 'node-b'" "node-b's slice unchanged" "$b_version"
TOKEN=dra-b request PUT "$slices/vap-b" "$(pslice vap-b node-b "o['metadata']['resourceVersion'] = '$b_version'; o['spec']['pool']['generation'] = 2")"
expect_code 200
# A slice of no node (allNodes) is no node's own.
TOKEN=dra-a request POST "$slices" "$(pslice vap-all node-a "del o['spec']['nodeName']; o['spec']['allNodes'] = True")"
expect_denied vap-all "$(not_yours node-a "one without spec.nodeName")"
# A token without the node-name extra: refused, saying what is needed, for every write.
TOKEN=dra-nowhere request POST "$slices" "$(pslice vap-nowhere node-a)"
expect_denied vap-nowhere "$no_node"
TOKEN=dra-nowhere request DELETE "$slices/vap-b"
expect_denied vap-b "$no_node"
# Reads are not admission's; another service account is not the policy's (only RBAC's).
TOKEN=dra-a request GET "$slices/vap-b"
expect_code 200
TOKEN=other-a request POST "$slices" "$(pslice vap-other node-b "o['spec']['pool']['name'] = 'vap-other'")"
expect_code 201
# A collection delete admits each slice as its own DELETE: node-a's go, node-b's stay, and the
# answer is the first refusal (node-b's slices in the order made: vap-b first).
TOKEN=dra-a request POST "$slices" "$(pslice vap-own node-a)"
expect_code 201
TOKEN=dra-a request DELETE "$slices?fieldSelector=spec.driver%3Dgpu-memory.vramgate.dev"
expect_denied vap-b "$(not_yours node-a "one of node 'node-b'")"
accepted_writes=$((accepted_writes + 1))  # the delete of node-a's two in it is a write too
request GET "$slices?fieldSelector=spec.driver%3Dgpu-memory.vramgate.dev"
check "[i['metadata']['name'] for i in b['items']] == ['vap-b', 'vap-other']" "node-a's deleted, node-b's kept"
request DELETE "$slices?fieldSelector=spec.driver%3Dgpu-memory.vramgate.dev"
expect_code 200
# An unknown token is no one, and neither is a request without one (no anonymous admin).
TOKEN=forged request GET "$slices"
expect_status 401 Unauthorized
NOTOKEN=1 request GET "$slices"
expect_status 401 Unauthorized
NOTOKEN=1 request POST "$slices" "$(pslice no-token node-a)"
expect_status 401 Unauthorized

echo "== ValidatingAdmissionPolicy: the evaluation's rules (tests/support/vap.py)"
checks=$((checks + 1))
PYTHONPATH="$here:$cel" "$python" - "$schemas" "$work" <<'PY' || fail "policy evaluation rules"
import os, sys
import apiserver, vap
schemas, work = apiserver.Schemas(sys.argv[1]), sys.argv[2]
kind = {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceSlice"}
user = apiserver.user_info("system:serviceaccount:kube-system:vramgate-dra", "node-a")
obj = {"metadata": {"name": "s"}, "spec": {"nodeName": "node-a"}}

def policies(spec, binding=None, name="p"):
    path = os.path.join(work, "policy.yaml")
    import json
    with open(path, "w") as f:
        f.write(json.dumps({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                            "metadata": {"name": name}, "spec": spec}) + "\n---\n")
        f.write(json.dumps({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                            "metadata": {"name": "b"}, "spec": binding or {"policyName": name, "validationActions": ["Deny"]}}))
    return vap.Policies([path], schemas)

rules = {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                            "resources": ["resourceslices"]}]}
def outcome(spec, operation="CREATE", binding=None, o=obj, old=None):
    try:
        return policies(spec, binding).admit(operation, kind, "resourceslices", "s", o, old, user)
    except vap.Denied as e:
        return (e.code, e.reason, e.details["causes"][0]["message"])

def denied(message, code=422, reason="Invalid"):
    return (code, reason, "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: " + message)

false = {"matchConstraints": rules, "validations": [{"expression": "object.spec.nodeName == 'node-b'"}]}
assert outcome(false) == denied("failed expression: object.spec.nodeName == 'node-b'"), outcome(false)
assert outcome(false, "UPDATE") == [], "an operation not in the rules"
assert outcome(false, binding={"policyName": "p", "validationActions": ["Warn", "Audit"]}) == ["p"], "no Deny"
assert outcome(dict(false, matchConditions=[{"name": "never", "expression": "request.userInfo.username == 'x'"},
                                             {"name": "broken", "expression": "request.nope"}])) == [], \
    "a false condition wins over an error"
broken = outcome(dict(false, matchConditions=[{"name": "broken", "expression": "request.nope == 1"}]))
assert broken[:2] == (422, "Invalid") and "failed to evaluate match condition broken" in broken[2], broken
assert outcome(dict(false, failurePolicy="Ignore", matchConditions=[{"name": "broken", "expression": "request.nope == 1"}])) == []
error = outcome({"matchConstraints": rules, "validations": [{"expression": "object.spec.absent == 'x'", "message": "m"}]})
assert error[:2] == (422, "Invalid") and "expression 'object.spec.absent == 'x'' resulted in error" in error[2], error
assert outcome({"matchConstraints": rules, "failurePolicy": "Ignore",
                "validations": [{"expression": "object.spec.absent == 'x'"}]}) == ["p"]
fallback = {"matchConstraints": rules, "validations": [{"expression": "false", "message": "static", "reason": "Forbidden",
                                                         "messageExpression": "object.spec.absent"}]}
assert outcome(fallback) == denied("static", 403, "Forbidden"), outcome(fallback)
chained = {"matchConstraints": rules, "variables": [{"name": "n", "expression": "object.spec.nodeName"},
                                                     {"name": "m", "expression": "variables.n + '!'"},
                                                     {"name": "unused", "expression": "object.spec.absent"}],
           "validations": [{"expression": "variables.m == 'node-b!'", "messageExpression": "'got ' + variables.m"}]}
assert outcome(chained) == denied("got node-a!"), outcome(chained)
# A subresource is matched by its own name only, and a rule's scope by the resource's.
claim = {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}
def on_claim(resources, subresource, scope="*"):
    spec = {"matchConstraints": {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
            "operations": ["UPDATE"], "resources": resources, "scope": scope}]},
            "validations": [{"expression": "request.subResource + '/' + request.namespace == 'x'"}]}
    try:
        return policies(spec).admit("UPDATE", claim, "resourceclaims", "c", {}, {}, user,
                                    namespace="default", subresource=subresource)
    except vap.Denied as e:
        return e.details["causes"][0]["message"]
status_seen = denied("failed expression: request.subResource + '/' + request.namespace == 'x'")[2]
assert on_claim(["resourceclaims/status"], "status") == status_seen, on_claim(["resourceclaims/status"], "status")
assert on_claim(["resourceclaims/*"], "status") == status_seen
assert on_claim(["resourceclaims/status"], "") == [], "the claim itself is not its status"
assert on_claim(["resourceclaims"], "status") == [], "nor its status the claim"
assert on_claim(["resourceclaims/status"], "status", "Cluster") == [], "a namespaced resource"
assert on_claim(["resourceclaims/status"], "status", "Namespaced") == status_seen
for bad, says in [
        ({"matchConstraints": rules, "validations": [{"expresion": "true"}]}, "refused by the 1.36 schema"),
        ({"matchConstraints": rules, "validations": [{"expression": "1 +"}]}, "does not compile"),
        ({"matchConstraints": rules, "failurePolicy": "Never", "validations": [{"expression": "true"}]},
         "Fail or Ignore"),
        ({"matchConstraints": rules, "validations": [{"expression": "true", "reason": "Teapot"}]}, "reason 'Teapot'"),
        ({"matchConstraints": rules, "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
          "validations": [{"expression": "true"}]}, "paramKind is not implemented"),
        ({"matchConstraints": dict(rules, objectSelector={"matchLabels": {"a": "b"}}),
          "validations": [{"expression": "true"}]}, "objectSelector is not implemented")]:
    try:
        policies(bad)
    except SystemExit as e:
        assert says in str(e), (says, str(e))
    else:
        raise AssertionError(f"loaded: {bad}")
PY

echo "== resourceclaims"
claim_with_status="$(json_with "$valid_claim" "o['status'] = $valid_status")"
request POST "$claims?fieldManager=test" "$claim_with_status"
expect_code 201
check "b['apiVersion'] == 'resource.k8s.io/v1' and b['kind'] == 'ResourceClaim' and 'status' not in b \
and b['metadata']['namespace'] == 'default' and b['metadata']['generation'] == 1 and b['metadata']['uid']" \
  "created, without the status sent"
check "b['spec']['devices']['requests'][0]['exactly'].get('allocationMode') == 'ExactCount' \
and b['spec']['devices']['requests'][0]['exactly'].get('count') == 1" "with kube-apiserver's defaults"
claim_uid="$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["uid"])' "$body")"
claim_version="$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["resourceVersion"])' "$body")"
request POST "$claims" "$valid_claim"
expect_status 409 AlreadyExists 'resourceclaims.resource.k8s.io "trainer-gpu" already exists'
request POST "$claims" "$(json_with "$valid_claim" 'o["metadata"]["name"] = "Trainer"')"
expect_status 422 Invalid "metadata.name: "
request POST "$claims" "$(json_with "$valid_claim" 'o["metadata"]["name"] = "other"; o["spec"]["devices"]["requests"][0]["exactly"]["count"] = "1"')"
expect_status 422 Invalid "spec.devices.requests[0].exactly.count: "
request POST "$claims" "$(json_with "$valid_claim" 'o["metadata"]["name"] = "other"; o["spec"]["devices"]["requestz"] = []')"
expect_status 422 Invalid "spec.devices.requestz: Additional properties are not allowed"
request POST "$claims" "$(json_with "$valid_claim" 'o["metadata"]["name"] = "other"; o["metadata"]["namespace"] = "kube-system"')"
expect_status 400 BadRequest "does not match the namespace"
request GET "$claims/trainer-gpu"
expect_code 200
check "b['metadata']['uid'] == sys.argv[2]" "the stored claim" "$claim_uid"
request GET /apis/resource.k8s.io/v1/resourceclaims
expect_code 200
check "[i['metadata']['uid'] for i in b['items']] == [sys.argv[2]]" "every namespace's claims listed" "$claim_uid"
request GET "$claims/absent"
expect_status 404 NotFound 'resourceclaims.resource.k8s.io "absent" not found'

echo "== resourceclaims: status"
status_body() { json_with "$claim_with_status" "o['metadata']['resourceVersion'] = '$1'; $2"; }
request PUT "$claims/trainer-gpu/status" "$(json_with "$claim_with_status" 'pass')"
expect_status 409 Conflict "the object has been modified"
request PUT "$claims/trainer-gpu/status" "$(status_body 1 'pass')"
expect_status 409 Conflict "the object has been modified"
request PUT "$claims/absent/status" "$(status_body 1 'o["metadata"]["name"] = "absent"')"
expect_status 404 NotFound
request PUT "$claims/trainer-gpu" "$(status_body "$claim_version" 'pass')"
expect_status 405 MethodNotAllowed
# A status PUT with one edit ("where|edit|says") refused as Invalid, at the field path that
# the printf format $1 makes of `where`, with a message that says `says`.
status_refused() {
  local where edit says
  IFS='|' read -r where edit says <<<"$2"
  request PUT "$claims/trainer-gpu/status" "$(status_body "$claim_version" "$edit")"
  # shellcheck disable=SC2059 # the format is the caller's
  expect_status 422 Invalid "$(printf "$1" "$where")"
  check "sys.argv[2] in b['message']" "says $says" "$says"
}
result='o["status"]["allocation"]["devices"]["results"][0]'
for broken in \
  "shareID|$result[\"shareID\"] = \"not-a-uuid\"|must be a lowercase UUID" \
  "shareID|$result[\"shareID\"] = \"9A0C6A1E-5E2B-4C7F-8D3A-1B2C3D4E5F60\"|must be a lowercase UUID" \
  "consumedCapacity[memory]|$result[\"consumedCapacity\"][\"memory\"] = \"6 Gi\"|quantities must match" \
  "device|$result[\"device\"] = \"\"|Required value" \
  "driver|$result[\"driver\"] = \"\"|Required value" \
  "pool|$result[\"pool\"] = \"\"|Required value" \
  "request|$result[\"request\"] = \"\"|Required value"; do
  status_refused "status.allocation.devices.results[0].%s: " "$broken"
done
request PUT "$claims/trainer-gpu/status" "$(status_body "$claim_version" "del $result[\"pool\"]")"
expect_status 422 Invalid "status.allocation.devices.results[0]: 'pool' is a required property"
request PUT "$claims/trainer-gpu/status" "$(status_body "$claim_version" 'o["status"]["allocation"]["nodeSelektor"] = {}')"
expect_status 422 Invalid "status.allocation.nodeSelektor: Additional properties are not allowed"
# status.devices (a driver's report): an allocated device, once, data a JSON object of at most
# 10 KiB, as validateDeviceStatus says.
ours='{"driver": "gpu-memory.vramgate.dev", "pool": "node-a", "device": "gpu-0", "shareID": "9a0c6a1e-5e2b-4c7f-8d3a-1b2c3d4e5f60", "data": {"tier": "guardrails", "request": 6442450944}}'
for broken in \
  "status.devices[0]: Invalid value|o['status']['devices'] = [dict($ours, device='gpu-1')]|must be an allocated device in the claim" \
  "status.devices[0]: Invalid value|o['status']['devices'] = [dict($ours, shareID=None)]|must be an allocated device in the claim" \
  "status.devices[0]: Invalid value|o['status']['devices'] = [dict($ours, driver='nic.example.com')]|must be an allocated device in the claim" \
  "status.devices[0]: Invalid value|o['status']['devices'] = [$ours]; del o['status']['allocation']|must be an allocated device in the claim" \
  "status.devices[1]: Duplicate value|o['status']['devices'] = [$ours, $ours]|gpu-memory.vramgate.dev/node-a/gpu-0/9a0c6a1e" \
  "status.devices[0].data: Too long|o['status']['devices'] = [dict($ours, data={'x': 'y' * 10240})]|may not be more than 10240 bytes" \
  "status.devices[0].data: |o['status']['devices'] = [dict($ours, data='guardrails')]|is not of type" \
  "status.devices[0].datta: |o['status']['devices'] = [dict($ours, datta={})]|Additional properties are not allowed" \
  "status.devices[0].conditions: Too many|o['status']['devices'] = [dict($ours, conditions=[{'type': f'T{n}', 'status': 'True', 'reason': 'R', 'message': '', 'lastTransitionTime': '2026-01-01T00:00:00Z'} for n in range(9)])]|at most 8 items"; do
  status_refused "%s" "$broken"
done
request PUT "$claims/trainer-gpu/status" "$(status_body "$claim_version" 'o["spec"]["devices"]["requests"][0]["name"] = "changed"')"
expect_code 200
check "b['status'] == json.loads(sys.argv[2]) and b['spec']['devices']['requests'][0]['name'] == 'gpu' \
and b['metadata']['uid'] == sys.argv[3] and b['metadata']['generation'] == 1 \
and int(b['metadata']['resourceVersion']) > int(sys.argv[4])" \
  "status replaced, spec kept" "$valid_status" "$claim_uid" "$claim_version"
request GET "$claims/trainer-gpu/status"
check "b['status']['allocation']['devices']['results'][0]['shareID'] == '9a0c6a1e-5e2b-4c7f-8d3a-1b2c3d4e5f60'" "the stored status"
status_version="$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["resourceVersion"])' "$body")"
request PUT "$claims/trainer-gpu/status" "$(status_body "$status_version" "o['status']['devices'] = [$ours]")"
expect_code 200
check "b['status']['devices'][0]['data'] == {'tier': 'guardrails', 'request': 6442450944}" "a driver's device status, stored"
request DELETE "$claims/trainer-gpu/status"
expect_status 405 MethodNotAllowed
request DELETE "$claims/trainer-gpu"
expect_code 200
check "b['metadata']['name'] == 'trainer-gpu'" "the deleted claim"
request DELETE "$claims/trainer-gpu"
expect_status 404 NotFound
request GET "$claims/trainer-gpu"
expect_status 404 NotFound

echo "== /_writes and /_rejected"
request GET /_writes
expect_code 200
check "len(b) == int(sys.argv[2]) and all(set(w) == {'method', 'path', 'name', 'time_ns'} for w in b) \
and [w['time_ns'] for w in b] == sorted(w['time_ns'] for w in b) \
and b[0] == dict(b[0], method='POST', path='/apis/resource.k8s.io/v1/resourceslices', name='node-a-gpu-memory.vramgate.dev') \
and b[-1]['method'] == 'DELETE' and b[-1]['name'] == 'trainer-gpu'" \
  "every accepted write, in order" "$accepted_writes"
request GET /_rejected
expect_code 200
check "len(b) == int(sys.argv[2]) and all(set(r) == {'method', 'path', 'code', 'message'} for r in b) \
and all(r['code'] >= 400 for r in b) and not any(r['code'] == 500 for r in b)" \
  "every rejected write, none a server error" "$rejected_writes"
checks=$((checks + 1))
! grep -q 'stand-in API server error\|Traceback' "$work/stderr" || fail "a server error in the log"

echo "apiserver selftest: $checks checks passed ($accepted_writes writes accepted, $rejected_writes refused)"
