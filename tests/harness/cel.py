"""The CRD's CEL rules (``x-kubernetes-validations``) evaluated as a Kubernetes API server
evaluates them, for tests: every rule on every schema node the object has, with ``self`` bound
to that node's value, and Kubernetes' quantity library (1.29 and later) beside CEL's standard
functions. ``matches`` is RE2, as in Kubernetes."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import celpy
from celpy import celtypes
from kubernetes.utils import parse_quantity


@dataclass(frozen=True)
class Quantity:
    value: Decimal


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(Decimal(parse_quantity(str(text))))
    except (ValueError, InvalidOperation) as error:
        raise ValueError(f"{text!r} is not a quantity") from error


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        _quantity(text)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _compare(a: Quantity, b: Quantity) -> int:
    return (a.value > b.value) - (a.value < b.value)


QUANTITY_LIBRARY = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "sign": lambda a: celtypes.IntType(_compare(a, Quantity(Decimal(0)))),
}


@dataclass(frozen=True)
class Failure:
    path: str  # the schema node's place in the object, e.g. ".spec.runtime"
    rule: str
    message: str


@functools.cache
def _program(rule: str) -> celpy.Runner:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule), functions=QUANTITY_LIBRARY)


def _nodes(schema: Mapping[str, Any], value: Any, path: str
           ) -> Iterator[tuple[Mapping[str, Any], Any, str]]:
    yield schema, value, path
    if isinstance(value, Mapping):
        for key, child in (schema.get("properties") or {}).items():
            if key in value:
                yield from _nodes(child, value[key], f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            yield from _nodes(schema["items"], item, f"{path}[{index}]")


def rule_failures(schema: Mapping[str, Any], obj: Any) -> list[Failure]:
    """Every CEL rule of ``schema`` that ``obj`` breaks (an error in evaluation counts as
    breaking it, as the API server refuses then too)."""
    failures = []
    for node, value, path in _nodes(schema, obj, ""):
        for rule in node.get("x-kubernetes-validations") or []:
            try:
                verdict = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
            except Exception as error:  # celpy raises its own evaluation errors
                verdict = error
            if verdict is not True and not (isinstance(verdict, celtypes.BoolType)
                                            and bool(verdict)):
                failures.append(Failure(path, rule["rule"], rule.get("message", "")))
    return failures
