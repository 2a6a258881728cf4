"""The operator's perf subsystem: benchmark and WER Jobs whenever the serving profile changes.

Every new serving-config hash (with `spec.perf.enabled`) gets a benchmark sweep and a WER run,
as two Kubernetes Jobs running the `perf-jobs` program:

- `jobs` builds those Jobs (names, labels, the program's config, the Job itself);
- `results` reads what a Job did off the Job and its pod's termination message;
- `status` renders the results as `status.perf`;
- `gate` judges a candidate's numbers against its baseline's (the regression gate);
- `lastgood` keeps the last configuration that passed the gate, for the next gate and for
  rollback;
- `plan` is the one pure decision per reconcile that ties them together;
- `search` chooses among candidate profiles by spec.slo (spec.profile.search), with the same
  Jobs, results and gate, and tells the reconciler which configuration `plan` should serve.

All of it is pure functions over plain dicts; the reconciler does the reading and writing.
"""
