"""Asserts fields of a rendered chart: `expect.py RENDERED.yaml CLAIM...`.

Each CLAIM is `KIND/NAME:PATH=JSON` (the field at PATH equals the JSON
value), `KIND/NAME:PATH=!` (there is no such field) or `KIND/NAME=!` (no
such resource). PATH is dot-separated keys and list steps: `[3]` (an index)
or `[name=worker]` (the item whose `name` is `worker`), e.g.
`Deployment/belay-worker-gpu:spec.template.spec.containers[name=worker].env[name=BELAY_WORKER_POOL].value="gpu"`.
A key containing dots is quoted: `nodeSelector."cloud.example.com/gpu"`.
Prints each claim checked; exits 1 naming the first that fails. Run by
.ci/helm.sh with the Python of its kubernetes-validate venv (PyYAML).
"""

import json
import re
import sys

import yaml

MISSING = object()
STEP = re.compile(r'\.?(?:"([^"]+)"|([^.\[\]"]+)|\[(\d+)\]|\[([^=\]]+)=([^\]]*)\])')


def steps(path):
    """The steps of PATH: keys, indexes and (key, value) selections."""
    out, pos = [], 0
    while pos < len(path):
        m = STEP.match(path, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot parse path {path!r} at {path[pos:]!r}")
        quoted, key, index, sel_key, sel_value = m.groups()
        if index is not None:
            out.append(int(index))
        elif sel_key is not None:
            out.append((sel_key, sel_value))
        else:
            out.append(quoted or key)
        pos = m.end()
    return out


def walk(node, path):
    """The value at PATH under NODE, or MISSING."""
    for step in steps(path):
        if isinstance(step, int):
            node = node[step] if isinstance(node, list) and step < len(node) else MISSING
        elif isinstance(step, tuple):
            key, value = step
            found = [i for i in node or [] if isinstance(i, dict) and str(i.get(key)) == value]
            node = found[0] if isinstance(node, list) and found else MISSING
        else:
            node = node.get(step, MISSING) if isinstance(node, dict) else MISSING
        if node is MISSING:
            return MISSING
    return node


def check(resources, claim):
    """None when CLAIM holds, else why not."""
    target, _, expected = claim.rpartition("=")
    ref, _, path = target.partition(":")
    resource = resources.get(ref, MISSING)
    if not path:
        if expected != "!":
            return f"a claim on a whole resource must be {ref}=!"
        return None if resource is MISSING else f"{ref} exists"
    if resource is MISSING:
        return f"no resource {ref} (have: {', '.join(sorted(resources))})"
    actual = walk(resource, path)
    if expected == "!":
        return None if actual is MISSING else f"{path} is {json.dumps(actual)}, expected none"
    if actual is MISSING:
        return f"{path} is missing, expected {expected}"
    # Compared as canonical JSON, so that true is not 1 and order of keys does not count.
    same = json.dumps(actual, sort_keys=True) == json.dumps(json.loads(expected), sort_keys=True)
    return None if same else f"{path} is {json.dumps(actual)}, expected {expected}"


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    resources = {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}
    for claim in sys.argv[2:]:
        why = check(resources, claim)
        if why:
            print(f"FAILED {claim}: {why}", file=sys.stderr)
            sys.exit(1)
        print(f"holds {claim}")


if __name__ == "__main__":
    main()
