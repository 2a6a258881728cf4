"""The demo's `kubectl get` view prints the CRD's own printer columns, values included."""

from __future__ import annotations

from minicpm_speech_operator.report import printer_columns, status_table


def test_the_table_is_the_crds_printer_columns() -> None:
    speech = {"metadata": {"name": "speech"}, "status": {
        "profile": "default", "phase": "Ready", "configHash": "abc",
        "replicas": 3, "readyReplicas": 2,
        "conditions": [{"type": "Progressing", "status": "False"},
                       {"type": "Ready", "status": "True"},
                       {"type": "SLO", "status": "True", "reason": "Met"}],
        "perf": {"headline": {"audioThroughput": 24.5},
                 "quality": {"werPercent": 3.1, "sim": 0.72}}}}
    header, row = (line.split() for line in status_table(speech).splitlines())
    names = [c["name"].upper() for c in printer_columns() if c["type"] != "date"]
    assert header == ["NAME", *names]
    assert dict(zip(header, row, strict=True)) == {
        "NAME": "speech", "PROFILE": "default", "PHASE": "Ready", "READY": "True",
        "REPLICAS": "3", "AVAILABLE": "2", "CONFIG": "abc", "AUDIO-S/S": "24.5", "WER": "3.1",
        "SIM": "0.72", "SLO": "Met"}


def test_a_resource_without_status_prints_its_name_only() -> None:
    lines = status_table({"metadata": {"name": "new"}}).splitlines()
    assert lines[1].split() == ["new"]
