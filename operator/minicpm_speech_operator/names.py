"""Which MiniCPMSpeech names can name every child, and the Kubernetes rules they follow.

The one owner of the resource's name rule: the CRD's CEL rule (``NAME_RULE``) and the
operator's check (:func:`check_resource_name`) are both derived from the constants here, and
a test holds the CRD's text to them. The children's own names and labels are checked against
Kubernetes' rules before any is created (:func:`check_children`), so a child the API server
would refuse stops the whole set, not its second half.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import InvalidSpec

# Kubernetes' own limits (k8s.io/apimachinery/pkg/util/validation).
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
DNS1035_LABEL_MAX = 63
LABEL_VALUE_MAX = 63
LABEL_NAME_MAX = 63
DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*"
DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"

# Every name a child gets from the resource's NAME (manifests.py, perf/lastgood.py). The
# Service and the Deployment are NAME itself, and NAME is the label value
# app.kubernetes.io/instance of every child; the perf Jobs cut and hash NAME to fit 63.
DEPLOY_CONFIG_SUFFIX = "-deploy-config"
LASTGOOD_SUFFIX = f"{DEPLOY_CONFIG_SUFFIX}-lastgood"
CHILD_SUFFIXES = ("", DEPLOY_CONFIG_SUFFIX, LASTGOOD_SUFFIX)

# The Service is named NAME (a DNS-1035 label) and NAME is a label value: both allow 63.
# The ConfigMaps (DNS-1123 subdomains) add their suffix, and must still fit 253.
MAX_NAME_LENGTH = min(
    DNS1035_LABEL_MAX,
    LABEL_VALUE_MAX,
    DNS1123_SUBDOMAIN_MAX - max(len(suffix) for suffix in CHILD_SUFFIXES),
)
NAME_PATTERN = f"^{DNS1035_LABEL}$"
NAME_RULE = (f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && "
             f"self.metadata.name.matches('{NAME_PATTERN}')")
NAME_FIX = (f"Use a name of at most {MAX_NAME_LENGTH} characters: lowercase letters, digits "
            "and '-', starting with a letter and ending with a letter or digit (the Service "
            "is named after the resource, and Service names are DNS-1035 labels)")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a MiniCPMSpeech's children, or None when it can."""
    if len(name) > MAX_NAME_LENGTH:
        return f"{name!r} is {len(name)} characters long, more than {MAX_NAME_LENGTH}"
    if re.fullmatch(DNS1035_LABEL, name) is None:
        return f"{name!r} is not a DNS-1035 label, so no Service can be named after it"
    return None


def check_resource_name(name: str) -> None:
    problem = name_problem(name)
    if problem is not None:
        raise InvalidSpec("metadata.name", problem, NAME_FIX)


def _object_name_problem(kind: str, name: str) -> str | None:
    if kind == "Service":
        if len(name) > DNS1035_LABEL_MAX or not re.fullmatch(DNS1035_LABEL, name):
            return f"must be a DNS-1035 label of at most {DNS1035_LABEL_MAX} characters"
    elif len(name) > DNS1123_SUBDOMAIN_MAX or not re.fullmatch(DNS1123_SUBDOMAIN, name):
        return f"must be a DNS-1123 subdomain of at most {DNS1123_SUBDOMAIN_MAX} characters"
    return None


def label_problem(key: str, value: str) -> str | None:
    """Why a label is not one Kubernetes accepts, or None."""
    prefix, _, label_name = key.rpartition("/")
    if prefix and (len(prefix) > DNS1123_SUBDOMAIN_MAX
                   or not re.fullmatch(DNS1123_SUBDOMAIN, prefix)):
        return f"label key {key!r}: the prefix must be a DNS-1123 subdomain"
    if not label_name or len(label_name) > LABEL_NAME_MAX or not re.fullmatch(
            "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", label_name):
        return f"label key {key!r}: the name must be 1 to {LABEL_NAME_MAX} characters, " \
               "alphanumeric at both ends, with '-', '_' or '.' inside"
    if len(value) > LABEL_VALUE_MAX or not re.fullmatch(LABEL_VALUE, value):
        return (f"label {key}={value!r}: a value must be at most {LABEL_VALUE_MAX} characters, "
                "alphanumeric at both ends, with '-', '_' or '.' inside")
    return None


def _labels_of(child: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    spec = child.get("spec") or {}
    yield child.get("metadata", {}).get("labels") or {}
    yield ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    selector = spec.get("selector") or {}
    yield selector.get("matchLabels") or {} if child.get("kind") != "Service" else selector


def check_children(children: Iterable[Mapping[str, Any]]) -> None:
    """Raise InvalidSpec for the first child whose name or labels the API server would
    refuse, before any child is created."""
    for child in children:
        kind, name = child["kind"], child["metadata"]["name"]
        problem = _object_name_problem(kind, name)
        for labels in _labels_of(child):
            if problem is None:
                problem = next((p for k, v in labels.items()
                                if (p := label_problem(str(k), str(v)))), None)
        if problem is not None:
            raise InvalidSpec(f"{kind} {name}", f"cannot be created: {problem}",
                              "Rename the MiniCPMSpeech or change the field that sets it")
