"""The operator's install manifests for one cluster, rendered from the kustomize files the
package ships (deploy/kubernetes/operator, which wingsmith/deploy links), without kustomize.

`wingsmith operator manifests` works from an installed wheel, where neither kubectl nor the
repository is at hand. The operator's overlays use a few of kustomize's fields; this module does
those as kustomize does and refuses a kustomization with any other, so an overlay that comes to
use more fails loudly instead of rendering something else. The result is what `kubectl
kustomize` gives for an overlay of one's own over the chosen one that merges the cluster's
settings into the ConfigMap and sets the image (tests/integration/test_operator_manifests.py
holds the two equal).
"""

from __future__ import annotations

import copy
import hashlib
import json
import posixpath
from collections.abc import Iterable, Iterator, Mapping
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

import yaml

Object = dict[str, Any]

OVERLAYS = ("base", "read-only", "adopt")
FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "configMapGenerator"}
FIELDS |= {"images", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
# kustomize's output order of kinds (its "legacy" order); other kinds follow, by kind
ORDER = [
    *("Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition"),
    *("ServiceAccount", "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding"),
    *("ClusterRoleBinding", "ConfigMap", "Secret", "Endpoints", "Service", "LimitRange"),
    *("PriorityClass", "PersistentVolume", "PersistentVolumeClaim", "Deployment"),
    *("StatefulSet", "CronJob", "PodDisruptionBudget"),
]


def operator(
    overlay: str, config: Mapping[str, str], image: Mapping[str, str] | None = None
) -> list[Object]:
    """The objects of `overlay` (one of `OVERLAYS`), with `config` merged into the operator's
    ConfigMap and `image` (kustomize's `newName`, `newTag`, `digest`) applied to the image
    `wingsmith`."""
    if overlay not in OVERLAYS:
        raise ValueError(f"no operator overlay {overlay!r}: one of {', '.join(OVERLAYS)}")
    objects = _build(overlay, {"wingsmith-operator": config})
    if not any(o["kind"] == "ConfigMap" and config.items() <= o["data"].items() for o in objects):
        raise ValueError(f"{overlay}: no ConfigMap wingsmith-operator to fill in")
    if image:
        _set_images(objects, [{"name": "wingsmith", **image}])
    return sorted(objects, key=_order)


def dump(objects: Iterable[Object]) -> str:
    """A YAML stream, as `kubectl apply -f -` takes it (keys sorted, as kustomize prints)."""
    text: str = yaml.safe_dump_all(list(objects), sort_keys=True, width=1 << 16)
    return text


def _root() -> Traversable:
    return files("wingsmith") / "deploy" / "kubernetes" / "operator"


def _open(path: str) -> Traversable:
    """A file or directory of the shipped tree, by its path from deploy/kubernetes/operator; a
    path out of the tree is refused, as kustomize refuses one out of its root."""
    normal = posixpath.normpath(path)
    if normal.startswith(("..", "/")):
        raise ValueError(f"{path}: out of deploy/kubernetes/operator")
    return _root().joinpath(*normal.split("/"))


def _build(directory: str, merged: Mapping[str, Mapping[str, str]]) -> list[Object]:
    """The objects of one kustomization; `merged` maps a generated ConfigMap's name to values
    merged into it (kustomize's `behavior: merge`)."""
    k = _documents(f"{directory}/kustomization.yaml")[0]
    if unknown := set(k) - FIELDS:
        raise ValueError(f"{directory}: kustomization fields not done here: {sorted(unknown)}")
    objects = [o for r in k.get("resources", []) for o in _resource(f"{directory}/{r}", merged)]
    renamed: dict[str, str] = {}
    for generator in k.get("configMapGenerator", []):
        generated = _config_map(directory, generator, merged.get(generator["name"], {}))
        renamed[generator["name"]] = generated["metadata"]["name"]
        objects.append(generated)
    for patch in k.get("patches", []):
        objects = _patched(objects, patch)
    if "namespace" in k:
        for o in objects:
            if o["kind"] not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = k["namespace"]
    _add_labels(objects, k.get("labels", []))
    _set_images(objects, k.get("images", []))
    _rename_config_maps(objects, renamed)
    return objects


def _add_labels(objects: list[Object], labels: list[Object]) -> None:
    """kustomize's `labels` without `includeSelectors` or `includeTemplates`: on the objects'
    own metadata only, never on selectors or pod templates."""
    for entry in labels:
        if set(entry) != {"pairs"}:
            raise ValueError(f"labels: only `pairs` is done here: {entry}")
        for o in objects:
            o["metadata"].setdefault("labels", {}).update(entry["pairs"])


def _resource(path: str, merged: Mapping[str, Mapping[str, str]]) -> list[Object]:
    if _open(path).is_dir():
        return _build(posixpath.normpath(path), merged)
    return _documents(path)


def _documents(path: str) -> list[Object]:
    return [d for d in yaml.safe_load_all(_open(path).read_text()) if d]


def _config_map(directory: str, generator: Object, merged: Mapping[str, str]) -> Object:
    """A ConfigMap from env files, named with kustomize's content hash suffix."""
    if set(generator) - {"name", "envs"}:
        raise ValueError(f"{directory}: configMapGenerator: only `name` and `envs`")
    data: dict[str, str] = {}
    for env in generator.get("envs", []):
        data |= _env_file(f"{directory}/{env}")
    data |= merged
    name = f"{generator['name']}-{_hash_suffix(data)}"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def _env_file(path: str) -> dict[str, str]:
    data: dict[str, str] = {}
    for line in _open(path).read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, equals, value = line.partition("=")
        if not equals:  # kustomize would read the value from its own environment
            raise ValueError(f"{path}: {line!r} has no value")
        data[key.lstrip()] = value
    return data


def _hash_suffix(data: Mapping[str, str]) -> str:
    """kustomize's suffix for a generated ConfigMap: the first ten hex digits of the SHA-256 of
    a JSON of its kind, data and name, with 0, 1, 3, a and e swapped for letters (so that the
    suffix is never all digits). The name is empty: kustomize 5 looks it up as one field called
    `metadata/name`, which finds nothing (the test holds this against `kubectl kustomize`).
    Go's JSON encoder sorts keys and escapes <, > and &, as here."""
    encoded = json.dumps(
        {"data": dict(data), "kind": "ConfigMap", "name": ""},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    for char, escaped in [("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")]:
        encoded = encoded.replace(char, escaped)
    for char in ("\u2028", "\u2029"):
        encoded = encoded.replace(char, f"\\u{ord(char):04x}")
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _patched(objects: list[Object], patch: Object) -> list[Object]:
    """A patch on the one object its target names: a strategic merge patch that deletes it, or
    JSON Patch operations (RFC 6902: add, replace, remove)."""
    if set(patch) != {"target", "patch"} or set(patch["target"]) - {"kind", "name"}:
        raise ValueError(f"patches: only `patch` with a target by kind and name: {patch}")
    target = patch["target"]
    matched = [o for o in objects if _is(o, target.get("kind"), target.get("name"))]
    if not matched:
        raise ValueError(f"patches: no {target} to patch")
    body = yaml.safe_load(patch["patch"])
    if isinstance(body, dict) and body.get("$patch") == "delete":
        return [o for o in objects if not any(o is m for m in matched)]
    if not isinstance(body, list):
        raise ValueError(f"patches: {target}: only `$patch: delete` or JSON Patch operations")
    for o in matched:
        for operation in body:
            _apply(o, operation)
    return objects


def _is(o: Object, kind: str | None, name: str | None) -> bool:
    return kind in (None, o["kind"]) and name in (None, o["metadata"]["name"])


def _apply(o: Object, operation: Object) -> None:
    *parents, last = [
        p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]
    ]
    node: Any = o
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    op = operation["op"]
    value = copy.deepcopy(operation.get("value"))
    if op not in ("add", "replace", "remove"):
        raise ValueError(f"patches: operation {op!r} is not supported here")
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if op == "add":
            node.insert(index, value)
        elif index >= len(node):
            raise ValueError(f"patches: nothing at {operation['path']} to {op}")
        elif op == "replace":
            node[index] = value
        else:
            del node[index]
        return
    if op != "add" and last not in node:
        raise ValueError(f"patches: nothing at {operation['path']} to {op}")
    if op == "remove":
        del node[last]
    else:
        node[last] = value


def _containers(o: Object) -> Iterator[Object]:
    spec = o.get("spec", {}).get("template", {}).get("spec", {})
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def _set_images(objects: list[Object], images: list[Object]) -> None:
    """kustomize's `images`: a container whose image has the entry's name gets its new name,
    tag or digest (a tag replaces a digest, and a digest a tag)."""
    for entry in images:
        if set(entry) - {"name", "newName", "newTag", "digest"}:
            raise ValueError(f"images: only name, newName, newTag and digest: {entry}")
        for container in (c for o in objects for c in _containers(o)):
            name, tag, digest = image_parts(container["image"])
            if name != entry["name"]:
                continue
            name = entry.get("newName", name)
            if "newTag" in entry:
                tag, digest = entry["newTag"], ""
            if "digest" in entry:
                tag, digest = "", entry["digest"]
            container["image"] = _image_text(name, tag, digest)


def image_parts(image: str) -> tuple[str, str, str]:
    """NAME[:TAG][@DIGEST]; a colon before the last slash is a registry's port."""
    name, _, digest = image.partition("@")
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        return name[:colon], name[colon + 1 :], digest
    return name, "", digest


def _image_text(name: str, tag: str, digest: str) -> str:
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def _rename_config_maps(objects: list[Object], renamed: Mapping[str, str]) -> None:
    """References to a generated ConfigMap follow it to its name with the suffix: in env
    variables, whole env sources and volumes."""
    for o in objects:
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        refs = [v.get("configMap") for v in spec.get("volumes", [])]
        for c in _containers(o):
            refs += [v.get("valueFrom", {}).get("configMapKeyRef") for v in c.get("env", [])]
            refs += [v.get("configMapRef") for v in c.get("envFrom", [])]
        for ref in refs:
            if ref is not None and ref.get("name") in renamed:
                ref["name"] = renamed[ref["name"]]


def _order(o: Object) -> tuple[int, str, str, str]:
    kind = o["kind"]
    rank = ORDER.index(kind) if kind in ORDER else len(ORDER)
    return rank, kind, o["metadata"].get("namespace", ""), o["metadata"]["name"]
