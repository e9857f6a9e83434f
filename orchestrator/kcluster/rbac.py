"""Authentication and RBAC of the emulated API server, as a real one does them.

- Identities by bearer token: the admin (group ``system:masters``: never refused, as on a real
  cluster; the cluster's own internals and tests' setup), any user, and service accounts
  ``system:serviceaccount:NS:NAME`` (groups ``system:serviceaccounts``,
  ``system:serviceaccounts:NS``, ``system:authenticated``); no token is ``system:anonymous``,
  an unknown one a 401.
- The request's verb as the API server derives it (``request_attrs``): GET one ``get``, GET a
  collection ``list``, ``?watch=true`` ``watch``, POST ``create``, PUT ``update``, PATCH
  ``patch``, DELETE ``delete`` (a collection: ``deletecollection``); subresources (``pods/log``,
  ``pods/proxy``, ``pods/portforward``) by the same mapping, so a websocket port-forward (a
  GET) is ``get pods/portforward``; on 1.35 and later (``AuthorizePodWebsocketUpgradeCreatePermission``,
  on by default) it also needs ``create``. Everything else (``/version``, ``/api``, ``/apis/...``)
  is a non-resource URL, its verb the method in lower case.
- Authorization from the Role, ClusterRole, RoleBinding and ClusterRoleBinding objects in the
  store (``rbac.authorization.k8s.io/v1``: apiGroups, resources with subresources and ``*/sub``,
  resourceNames, nonResourceURLs, verbs, ``*``); a ServiceAccount subject without a namespace
  in a RoleBinding is of the binding's namespace. A refusal is the real 403 Status
  (``pods is forbidden: User "u" cannot list resource "pods" in API group "" in the namespace "x"``).
- Escalation prevention: creating or updating a Role or ClusterRole that grants what the
  writer does not hold is refused (unless it has ``escalate`` on it), and so is a binding to a
  role whose permissions it does not hold (unless it has ``bind`` on the role), with the real
  ``is attempting to grant RBAC permissions not currently held`` message.

Approximations: no aggregated ClusterRoles (aggregationRule), no impersonation, no
SubjectAccessReview API; the bootstrap roles are cluster-admin, system:discovery and
system:public-info-viewer only.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.kcluster.objects import RESOURCES, ApiError, Route

Obj = dict[str, Any]
RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_PLURALS = ("roles", "clusterroles", "rolebindings", "clusterrolebindings")
MASTERS = "system:masters"
ADMIN_TOKEN = "kcluster-token"
ADMIN_NAME = "kcluster-admin"
# Kubernetes 1.35 made a websocket upgrade of exec, attach and portforward need `create` too.
WEBSOCKET_CREATE_MINOR = 35
CONNECT_SUBRESOURCES = ("portforward", "exec", "attach")


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()

    @property
    def privileged(self) -> bool:
        return MASTERS in self.groups


ADMIN = User(ADMIN_NAME, (MASTERS, "system:authenticated"))
ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))


def user_for(identity: str, groups: Iterable[str] = ()) -> User:
    """The user an identity authenticates as, with the groups the API server adds."""
    if identity.startswith("system:serviceaccount:"):
        parts = identity.split(":")
        if len(parts) != 4 or not parts[2] or not parts[3]:
            raise ValueError(f"not a service account identity: {identity!r} (system:serviceaccount:NS:NAME)")
        implied: tuple[str, ...] = ("system:serviceaccounts", f"system:serviceaccounts:{parts[2]}",
                                    "system:authenticated")
    elif identity == ANONYMOUS.name:
        implied = ("system:unauthenticated",)
    elif not identity:
        raise ValueError("an identity needs a name")
    else:
        implied = ("system:authenticated",)
    return User(identity, tuple(dict.fromkeys([*groups, *implied])))


class Identities:
    """Bearer tokens and who they are (any thread may ask for a token)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[str, User] = {ADMIN_TOKEN: ADMIN}
        self._tokens: dict[User, str] = {ADMIN: ADMIN_TOKEN}

    def token_for(self, identity: str | None = None, groups: Iterable[str] = ()) -> str:
        """The token of ``identity`` (None: the admin), made on first use."""
        if identity is None or identity == ADMIN_NAME:
            return ADMIN_TOKEN
        user = user_for(identity, groups)
        with self._lock:
            token = self._tokens.get(user)
            if token is None:
                token = self._tokens[user] = f"kcluster-{secrets.token_hex(16)}"
                self._users[token] = user
            return token

    def authenticate(self, authorization: str | None) -> User | None:
        """The user of an ``Authorization`` header; ANONYMOUS without one, None for a bad token."""
        if not authorization:
            return ANONYMOUS
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        with self._lock:
            return self._users.get(token.strip())


@dataclass(frozen=True)
class Attrs:
    """What a request asks, as the authorizer sees it (k8s.io/apiserver's RequestInfo)."""

    verb: str
    resource_request: bool
    path: str = ""
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def request_attrs(method: str, path: str, params: dict[str, str], route: Route | None) -> Attrs:
    """The verb, resource, subresource, namespace and name of a request."""
    method = method.upper()
    if route is None:
        return Attrs(verb={"HEAD": "get"}.get(method, method.lower()), resource_request=False, path=path)
    res = route.res
    name = route.name or ""
    sub = (route.sub or "").split("/", 1)[0]
    watch = params.get("watch") in ("true", "1")
    if method in ("GET", "HEAD"):
        verb = "watch" if watch else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
    namespace = route.namespace or ""
    if res.plural == "namespaces" and name:
        namespace = name  # a namespace is in itself (a RoleBinding there may grant `get` on it)
    return Attrs(verb=verb, resource_request=True, path=path, api_group=res.group, resource=res.plural,
                 subresource=sub, namespace=namespace, name=name)


def checks_for(attrs: Attrs, websocket: bool, minor: int) -> list[Attrs]:
    """Every authorization a request needs: its own, and on >= 1.35 ``create`` for a websocket
    upgrade of exec, attach and portforward (KEP-4006)."""
    out = [attrs]
    if (websocket and attrs.verb == "get" and attrs.resource == "pods"
            and attrs.subresource in CONNECT_SUBRESOURCES and minor >= WEBSOCKET_CREATE_MINOR):
        out.append(replace(attrs, verb="create"))
    return out


def _has(values: Iterable[str], want: str) -> bool:
    values = list(values or [])
    return "*" in values or want in values


def _resource_matches(rule: Obj, attrs: Attrs) -> bool:
    full = attrs.full_resource
    for r in rule.get("resources") or []:
        if r in ("*", full):
            return True
        if attrs.subresource and r == f"*/{attrs.subresource}":
            return True
    return False


def rule_allows(rule: Obj, attrs: Attrs) -> bool:
    """Whether one PolicyRule allows the request (the RBAC authorizer's RuleAllows)."""
    if not _has(rule.get("verbs") or [], attrs.verb):
        return False
    if not attrs.resource_request:
        for url in rule.get("nonResourceURLs") or []:
            if url in ("*", attrs.path) or (url.endswith("*") and attrs.path.startswith(url[:-1])):
                return True
        return False
    if not _has(rule.get("apiGroups") or [], attrs.api_group) or not _resource_matches(rule, attrs):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _subject_applies(subject: Obj, user: User, binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return bool(name == user.name)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return user.name == f"system:serviceaccount:{ns}:{name}"
    return False


class Authorizer:
    """RBAC over the objects of the store: ``objects(plural, namespace)`` lists them and
    ``get(plural, namespace, name)`` reads one (both on the server's loop)."""

    def __init__(self, objects: Callable[[str, str | None], list[Obj]],
                 get: Callable[[str, str | None, str], Obj | None]):
        self._objects = objects
        self._get = get

    def _role_rules(self, ref: Obj, namespace: str) -> list[Obj]:
        if ref.get("kind") == "ClusterRole":
            role = self._get("clusterroles", None, ref.get("name") or "")
        elif ref.get("kind") == "Role" and namespace:
            role = self._get("roles", namespace, ref.get("name") or "")
        else:
            role = None
        return list((role or {}).get("rules") or [])

    def rules(self, user: User, namespace: str) -> list[Obj]:
        """The rules that apply to ``user`` in ``namespace`` ("" : at the cluster scope)."""
        out: list[Obj] = []
        for crb in self._objects("clusterrolebindings", None):
            if any(_subject_applies(s, user, "") for s in crb.get("subjects") or []):
                out += self._role_rules(crb.get("roleRef") or {}, "")
        if namespace:
            for rb in self._objects("rolebindings", namespace):
                if any(_subject_applies(s, user, namespace) for s in rb.get("subjects") or []):
                    out += self._role_rules(rb.get("roleRef") or {}, namespace)
        return out

    def allows(self, user: User, attrs: Attrs) -> bool:
        if user.privileged:
            return True
        return any(rule_allows(r, attrs) for r in self.rules(user, attrs.namespace))

    def authorize(self, user: User, checks: list[Attrs]) -> None:
        """ApiError 403 (the real Status) for the first check ``user`` may not do."""
        for attrs in checks:
            if not self.allows(user, attrs):
                raise forbidden(user, attrs)

    # -- escalation prevention -------------------------------------------------------------------

    def check_escalation(self, user: User, plural: str, obj: Obj) -> None:
        """Refuse a Role/ClusterRole granting, or a binding to a role holding, permissions
        ``user`` does not hold itself (unless it may ``escalate`` / ``bind``)."""
        if user.privileged or plural not in RBAC_PLURALS:
            return
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        ns = (meta.get("namespace") or "") if plural in ("roles", "rolebindings") else ""
        if plural in ("roles", "clusterroles"):
            if self.allows(user, Attrs("escalate", True, api_group=RBAC_GROUP, resource=plural,
                                       namespace=ns, name=name)):
                return
            wanted = list(obj.get("rules") or [])
        else:
            ref = obj.get("roleRef") or {}
            ref_plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            if self.allows(user, Attrs("bind", True, api_group=RBAC_GROUP, resource=ref_plural,
                                       namespace=ns, name=ref.get("name") or "")):
                return
            role = self._get(ref_plural, ns or None, ref.get("name") or "")
            if role is None:
                res = RESOURCES[ref_plural]
                raise ApiError(404, "NotFound", f'{res.qualified} "{ref.get("name")}" not found',
                               {"name": ref.get("name"), "group": RBAC_GROUP, "kind": ref_plural})
            wanted = list(role.get("rules") or [])
        missing = uncovered(self.rules(user, ns), wanted)
        if missing:
            res = RESOURCES[plural]
            raise ApiError(403, "Forbidden", (
                f'{res.qualified} "{name}" is forbidden: user "{user.name}" (groups={go_quote(user.groups)}) '
                "is attempting to grant RBAC permissions not currently held:\n" + "\n".join(missing)),
                {"name": name, "group": RBAC_GROUP, "kind": plural})


def _atoms(rule: Obj) -> list[Obj]:
    """A rule broken down into one verb, group, resource (and name) each."""
    verbs = rule.get("verbs") or []
    if rule.get("nonResourceURLs"):
        return [{"nonResourceURLs": [u], "verbs": [v]} for u in rule["nonResourceURLs"] for v in verbs]
    names = rule.get("resourceNames") or [None]
    return [{"apiGroups": [g], "resources": [r], "verbs": [v], **({"resourceNames": [n]} if n else {})}
            for g, r, n, v in itertools.product(rule.get("apiGroups") or [], rule.get("resources") or [],
                                                names, verbs)]


def _covers(owner: Obj, atom: Obj) -> bool:
    (verb,) = atom["verbs"]
    if not _has(owner.get("verbs") or [], verb):
        return False
    if "nonResourceURLs" in atom:
        (url,) = atom["nonResourceURLs"]
        return any(u in ("*", url) or (u.endswith("*") and url.startswith(u[:-1]))
                   for u in owner.get("nonResourceURLs") or [])
    (group,), (resource,) = atom["apiGroups"], atom["resources"]
    if not _has(owner.get("apiGroups") or [], group):
        return False
    owned = owner.get("resources") or []
    base, _, sub = resource.partition("/")
    if not ("*" in owned or resource in owned or (sub and (f"*/{sub}" in owned or f"{base}/*" in owned))):
        return False
    names = owner.get("resourceNames") or []
    return not names or bool(atom.get("resourceNames")) and atom["resourceNames"][0] in names


def uncovered(owner: list[Obj], wanted: list[Obj]) -> list[str]:
    """The permissions of ``wanted`` no rule of ``owner`` covers, compacted and written as the
    API server writes them (``{APIGroups:["apps"], Resources:["deployments"], Verbs:["delete"]}``)."""
    merged: dict[tuple[str, ...], list[str]] = {}
    for rule in wanted:
        for atom in _atoms(rule):
            if any(_covers(o, atom) for o in owner):
                continue
            if "nonResourceURLs" in atom:
                key: tuple[str, ...] = ("url", atom["nonResourceURLs"][0])
            else:
                key = ("res", atom["apiGroups"][0], atom["resources"][0], *(atom.get("resourceNames") or []))
            verbs = merged.setdefault(key, [])
            if atom["verbs"][0] not in verbs:
                verbs.append(atom["verbs"][0])
    out = []
    for key, verbs in merged.items():
        if key[0] == "url":
            out.append(f"{{NonResourceURLs:{go_quote([key[1]])}, Verbs:{go_quote(verbs)}}}")
        else:
            names = f", ResourceNames:{go_quote(list(key[3:]))}" if key[3:] else ""
            out.append(f"{{APIGroups:{go_quote([key[1]])}, Resources:{go_quote([key[2]])}{names}, "
                       f"Verbs:{go_quote(verbs)}}}")
    return sorted(out)


def go_quote(values: Iterable[str]) -> str:
    """Go's ``%q`` of a []string: ``["a" "b"]``."""
    return "[" + " ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "]"


def forbidden(user: User, attrs: Attrs) -> ApiError:
    """The API server's 403 for a request RBAC refuses."""
    if not attrs.resource_request:
        return ApiError(403, "Forbidden", f'forbidden: User "{user.name}" cannot {attrs.verb} path "{attrs.path}"')
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    subject = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    where = f' in the namespace "{attrs.namespace}"' if attrs.namespace else " at the cluster scope"
    details: dict[str, Any] = {**({"name": attrs.name} if attrs.name else {}),
                               **({"group": attrs.api_group} if attrs.api_group else {}), "kind": attrs.resource}
    return ApiError(403, "Forbidden", f'{subject} is forbidden: User "{user.name}" cannot {attrs.verb} resource '
                    f'"{attrs.full_resource}" in API group "{attrs.api_group}"{where}', details)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


# The bootstrap policy a real cluster starts with (the part clients rely on).
BOOTSTRAP: list[Obj] = [
    {"kind": "ClusterRole", "metadata": {"name": "cluster-admin"}, "rules": [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
        {"nonResourceURLs": ["*"], "verbs": ["*"]}]},
    {"kind": "ClusterRoleBinding", "metadata": {"name": "cluster-admin"},
     "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
     "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": MASTERS}]},
    {"kind": "ClusterRole", "metadata": {"name": "system:discovery"}, "rules": [
        {"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                             "/openapi/*", "/readyz", "/version", "/version/"], "verbs": ["get"]}]},
    {"kind": "ClusterRoleBinding", "metadata": {"name": "system:discovery"},
     "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "system:discovery"},
     "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:authenticated"}]},
    {"kind": "ClusterRole", "metadata": {"name": "system:public-info-viewer"}, "rules": [
        {"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}]},
    {"kind": "ClusterRoleBinding", "metadata": {"name": "system:public-info-viewer"},
     "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "system:public-info-viewer"},
     "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:authenticated"},
                  {"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:unauthenticated"}]},
]
