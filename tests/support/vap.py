"""ValidatingAdmissionPolicy for the stand-in API server (tests/support/apiserver.py --policy):
the policies and bindings of a manifest (k8s/dra.yaml), evaluated on each write as
kube-apiserver's admission plugin evaluates them (k8s.io/apiserver/pkg/admission/plugin/policy/
validating), with cel-python (module `celpy`, fetched by scripts/fetch-cel-python) as the CEL
implementation.

What it does as kube-apiserver does:
- each object checked against the strict 1.36 schema when loaded, every expression compiled;
- matchConstraints.resourceRules (groups, versions, operations, resources with subresources,
  resourceNames, scope) then matchConditions, in order: a false one means the policy does not apply; an error, when
  none is false, is the failurePolicy's (Fail: denied; Ignore: not applied);
- variables in order, each seeing those before it (`variables.<name>`); validations in order;
  the first that is false, or fails with failurePolicy Fail, is the answer: its
  messageExpression, else its message, else `failed expression: <expression>`;
- the activation: `object` (null for DELETE), `oldObject` (null for CREATE), `request` (the
  AdmissionRequest: kind, resource, subResource, name, namespace, operation, userInfo with
  `extra` left out when empty, as its JSON omits it), `params` null (no paramKind),
  `namespaceObject` null (not implemented: no policy here reads it);
- the denial: the Status of admission.NewForbidden with the validation's reason (Invalid, 422,
  when none; Forbidden, 403; ...), `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy
  '<policy>' with binding '<binding>' denied request: <message>`, details with the one cause.

Not as kube-apiserver: no type checking against the OpenAPI schema (cel-python is dynamically
typed: a misspelt field is an error at evaluation, not at creation), no cost limits, no
`authorizer`; a policy or binding with paramKind, paramRef, matchResources, selectors,
excludeResourceRules or auditAnnotations is refused at load (not implemented) rather than
half-applied.
"""

import uuid

import yaml

try:
    import celpy
except ImportError as e:  # Said once, with what to run, instead of a traceback per test.
    raise SystemExit(f"apiserver.py --policy needs cel-python ({e}); run scripts/fetch-cel-python "
                     "and put its directory on PYTHONPATH")

POLICY_KIND = "ValidatingAdmissionPolicy"
BINDING_KIND = "ValidatingAdmissionPolicyBinding"
API_VERSION = "admissionregistration.k8s.io/v1"
SCHEMA = {POLICY_KIND: "validatingadmissionpolicy-admissionregistration-v1.json",
          BINDING_KIND: "validatingadmissionpolicybinding-admissionregistration-v1.json"}
REASON_CODE = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}


class Denied(Exception):
    """A write the policy refuses: code, reason and the whole Status body."""

    def __init__(self, code, reason, message, details):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


class Expression:
    def __init__(self, env, text, where):
        self.text = text
        try:
            self.program = env.program(env.compile(text))
        except Exception as e:  # celpy's CELParseError, or anything its compiler raises
            raise SystemExit(f"{where}: the expression does not compile: {e}\n{text}")

    def evaluate(self, activation):
        """The value, or raises Failed with cel-python's message."""
        try:
            return self.program.evaluate(activation)
        except Exception as e:
            raise Failed(f"expression '{self.text}' resulted in error: {e}")


class Failed(Exception):
    """An expression that could not be evaluated."""


def unsupported(obj, where, fields):
    for path in fields:
        value = obj
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value not in (None, {}, []):
            raise SystemExit(f"{where}: {path} is not implemented by the stand-in")


class Policy:
    def __init__(self, env, obj, where):
        spec = obj["spec"]
        self.name = obj["metadata"]["name"]
        unsupported(spec, where, ["paramKind", "auditAnnotations", "matchConstraints.namespaceSelector",
                                  "matchConstraints.objectSelector", "matchConstraints.excludeResourceRules"])
        self.failure_policy = spec.get("failurePolicy") or "Fail"
        if self.failure_policy not in ("Fail", "Ignore"):  # the schema has no enums
            raise SystemExit(f"{where}: failurePolicy {self.failure_policy!r}: Fail or Ignore")
        self.rules = (spec.get("matchConstraints") or {}).get("resourceRules") or []
        self.conditions = [(c["name"], Expression(env, c["expression"], f"{where}: matchConditions[{c['name']}]"))
                           for c in spec.get("matchConditions") or []]
        self.variables = []
        for v in spec.get("variables") or []:
            if v["name"] in [n for n, _ in self.variables]:
                raise SystemExit(f"{where}: variables[{v['name']}]: duplicate name")
            self.variables.append((v["name"], Expression(env, v["expression"], f"{where}: variables[{v['name']}]")))
        self.validations = []
        for i, v in enumerate(spec.get("validations") or []):
            here = f"{where}: validations[{i}]"
            message = v.get("messageExpression")
            if v.get("reason") not in (None, "Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge"):
                raise SystemExit(f"{here}: reason {v['reason']!r}: Unauthorized, Forbidden, Invalid or RequestEntityTooLarge")
            if "\n" in (v.get("message") or ""):
                raise SystemExit(f"{here}: message: must not contain line breaks")
            self.validations.append({
                "expression": Expression(env, v["expression"], here),
                "message": v.get("message"),
                "messageExpression": Expression(env, message, here + ".messageExpression") if message else None,
                "reason": v.get("reason") or "Invalid",
            })
        if not self.validations:
            raise SystemExit(f"{where}: no validations (the stand-in evaluates only those)")

    def matches(self, group, version, resource, subresource, namespaced, operation, name):
        """matchConstraints.resourceRules: `resources` names `resource` (no subresource),
        `resource/subresource`, `resource/*`, `*` (no subresource) or `*/*`; `scope` the
        resource's (Cluster or Namespaced)."""
        def has(values, value):
            return "*" in (values or []) or value in (values or [])

        def names_resource(resources):
            if subresource:
                return bool({f"{resource}/{subresource}", f"{resource}/*", f"*/{subresource}", "*/*"}
                            & set(resources))
            return resource in resources or "*" in resources or "*/*" in resources
        scope = "Namespaced" if namespaced else "Cluster"
        for rule in self.rules:
            if (has(rule.get("apiGroups"), group) and has(rule.get("apiVersions"), version)
                    and has(rule.get("operations"), operation)
                    and names_resource(rule.get("resources") or [])
                    and (rule.get("scope") or "*") in ("*", scope)
                    and (not rule.get("resourceNames") or name in rule["resourceNames"])):
                return True
        return False


class Policies:
    """Every ValidatingAdmissionPolicy and binding of the manifests; other kinds are skipped."""

    def __init__(self, paths, schemas):
        env = celpy.Environment()
        self.policies, self.bindings = {}, []
        for path in paths:
            with open(path) as f:
                documents = [d for d in yaml.safe_load_all(f) if d]
            for i, obj in enumerate(documents):
                kind = obj.get("kind")
                if kind not in SCHEMA:
                    continue
                where = f"{path}: {kind} {obj.get('metadata', {}).get('name')!r}"
                if obj.get("apiVersion") != API_VERSION:
                    raise SystemExit(f"{where}: apiVersion {obj.get('apiVersion')!r}, the stand-in serves {API_VERSION}")
                try:
                    schemas.check(SCHEMA[kind], obj)
                except Exception as e:
                    raise SystemExit(f"{where}: refused by the 1.36 schema: {e}")
                if kind == POLICY_KIND:
                    self.policies[obj["metadata"]["name"]] = Policy(env, obj, where)
                else:
                    spec = obj["spec"]
                    unsupported(spec, where, ["paramRef", "matchResources"])
                    actions = spec.get("validationActions") or []
                    if not actions or set(actions) - {"Deny", "Warn", "Audit"}:
                        raise SystemExit(f"{where}: validationActions {actions}: Deny, Warn or Audit")
                    self.bindings.append((obj["metadata"]["name"], spec["policyName"], spec["validationActions"]))
        for binding, policy, _ in self.bindings:
            if policy not in self.policies:
                raise SystemExit(f"binding {binding!r} names policy {policy!r}, which no --policy file has")
        if not self.bindings:
            raise SystemExit(f"{', '.join(paths)}: no {BINDING_KIND} (a policy without one applies to nothing)")

    def admit(self, operation, kind, resource, name, obj, old, user, namespace="", subresource=""):
        """Raises Denied for the first binding that denies the write (kube-apiserver reports the
        first denial); returns the names of the policies that applied. `namespace` for a
        namespaced resource, `subresource` for a write of one (`status`)."""
        group, version = kind["group"], kind["version"]
        request = {
            "uid": str(uuid.uuid4()),
            "kind": kind, "requestKind": kind,
            "resource": {"group": group, "version": version, "resource": resource},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": name, "operation": operation,
            "userInfo": {k: v for k, v in user.items() if v},
            "dryRun": False,
        }
        # As AdmissionRequest's JSON has them: omitted when empty.
        if namespace:
            request["namespace"] = namespace
        if subresource:
            request["subResource"] = request["requestSubResource"] = subresource
        activation = {k: celpy.json_to_cel(v) for k, v in
                      {"object": obj, "oldObject": old, "request": request, "params": None,
                       "namespaceObject": None}.items()}
        applied = []
        for binding, policy_name, actions in self.bindings:
            policy = self.policies[policy_name]
            if not policy.matches(group, version, resource, subresource, bool(namespace), operation, name):
                continue
            decision = self.decide(policy, dict(activation))
            if decision is None:
                continue
            applied.append(policy_name)
            if decision is True or "Deny" not in actions:  # Warn and Audit do not refuse
                continue
            reason, text = decision
            message = f"{POLICY_KIND} '{policy_name}' with binding '{binding}' denied request: {text}"
            shown = name or "Unknown"
            qualified = f"{resource}.{group}" if group else resource
            raise Denied(REASON_CODE.get(reason, 422), reason, f'{qualified} "{shown}" is forbidden: {message}',
                         {"name": shown, "group": group, "kind": resource, "causes": [{"message": message}]})
        return applied

    @staticmethod
    def decide(policy, activation):
        """None: not applied; True: admitted; (reason, message): denied."""
        errors = []
        for name, condition in policy.conditions:
            try:
                value = condition.evaluate(activation)
            except Failed as e:
                errors.append(f"failed to evaluate match condition {name}: {e}")
                continue
            if not isinstance(value, (bool, celpy.celtypes.BoolType)):
                errors.append(f"match condition {name} did not evaluate to a bool")
            elif not value:
                return None  # one false condition: not applied, whatever the others' errors
        if errors:
            return ("Invalid", "; ".join(errors)) if policy.failure_policy == "Fail" else None
        variables = {}
        activation["variables"] = celpy.celtypes.MapType({})
        for name, expression in policy.variables:
            try:
                variables[name] = expression.evaluate(activation)
            except Failed as e:
                # An error is kept as the variable's value: only a validation that reads it fails.
                variables[name] = celpy.CELEvalError(str(e))
            activation["variables"] = celpy.celtypes.MapType(
                {celpy.celtypes.StringType(k): v for k, v in variables.items()})
        for validation in policy.validations:
            try:
                value = validation["expression"].evaluate(activation)
                if not isinstance(value, (bool, celpy.celtypes.BoolType)):
                    raise Failed(f"expression '{validation['expression'].text}' resulted in {value!r}, not a bool")
            except Failed as e:
                if policy.failure_policy == "Fail":
                    return ("Invalid", str(e))
                continue
            if bool(value):
                continue
            message = None
            if validation["messageExpression"] is not None:
                try:
                    text = validation["messageExpression"].evaluate(activation)
                    if isinstance(text, str) and text.strip():
                        message = str(text).replace("\n", " ")
                except Failed:
                    pass  # kube-apiserver falls back to message too
            if message is None:
                message = validation["message"] or f"failed expression: {validation['expression'].text}"
            return (validation["reason"], message)
        return True


if __name__ == "__main__":
    raise SystemExit("imported by apiserver.py")
