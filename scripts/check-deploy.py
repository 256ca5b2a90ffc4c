#!/usr/bin/env python3
"""Checks of deploy/ that need more than promtool and kubernetes-validate (run by
scripts/check-deploy, inside its virtualenv: needs PyYAML and jsonschema).

* deploy/kubernetes (all-in-one) and deploy/kubernetes-split (sidecar + worker, with the
  first as its base): every manifest is listed in its kustomization and every listed file
  or base exists; the PodMonitor and the Kustomization validate strictly against the schemas in
  scripts/schemas/ (they are not core Kubernetes kinds, so kubernetes-validate has none).
* deploy/grafana/rollboard.json: valid JSON, a Prometheus data source variable, and every
  panel and target using it, every target with a PromQL expression.
* deploy/prometheus: every alert has a unit test case where it fires and one where it does
  not, and the summary, description and runbook_url annotations; every runbook_url is the
  one base URL declared in alerts.yml (`# runbook_base: URL`) followed by the anchor of a
  heading of docs/operations.md that exists.
* config/kustomization.yaml (the ConfigMap generator the layouts use): valid against the
  Kustomization schema, and it generates rollboard-config from config/rollboard.toml.
"""

import json
import re
import sys
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
errors = []


def fail(message):
    errors.append(message)


def load_yaml(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def check_kubernetes(base):
    schemas = {
        "PodMonitor": json.loads((ROOT / "scripts/schemas/podmonitor-v1.json").read_text()),
        "Kustomization": json.loads(
            (ROOT / "scripts/schemas/kustomization-v1beta1.json").read_text()
        ),
    }
    kustomization = load_yaml(base / "kustomization.yaml")[0]
    listed = set(kustomization.get("resources", []))
    if not listed:
        fail(f"{base.name}/kustomization.yaml lists no resources")
    for name in sorted(listed):
        if not (base / name).is_file() and not (base / name / "kustomization.yaml").is_file():
            fail(f"kustomization.yaml lists {name}, which does not exist")
    for path in sorted(base.glob("*.yaml")):
        if path.name != "kustomization.yaml" and path.name not in listed:
            fail(f"{path.name} is not listed in kustomization.yaml")
        for doc in load_yaml(path):
            schema = schemas.get(doc.get("kind"))
            if schema is None:
                continue  # a core kind: validated by kubernetes-validate
            try:
                jsonschema.validate(doc, schema)
                print(f"{base.name}/{path.name}: {doc['kind']} valid against scripts/schemas/")
            except jsonschema.ValidationError as e:
                where = ".".join(str(p) for p in e.absolute_path)
                fail(f"{path.name}: {doc['kind']} {where}: {e.message}")


def check_grafana():
    path = ROOT / "deploy/grafana/rollboard.json"
    try:
        dashboard = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        fail(f"{path.name}: not JSON: {e}")
        return
    variables = dashboard.get("templating", {}).get("list", [])
    sources = [
        v["name"]
        for v in variables
        if v.get("type") == "datasource" and v.get("query") == "prometheus"
    ]
    if not sources:
        fail(f"{path.name}: no Prometheus data source variable")
        return
    wanted = "${%s}" % sources[0]

    def uses_variable(ds):
        return isinstance(ds, dict) and ds.get("uid") == wanted or ds == wanted

    panels = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # panels inside collapsed rows
    ids = [p.get("id") for p in panels]
    if len(set(ids)) != len(ids):
        fail(f"{path.name}: panel ids are not unique")
    count = 0
    for panel in panels:
        if panel.get("type") == "row":
            continue
        title = panel.get("title", f"panel {panel.get('id')}")
        if not uses_variable(panel.get("datasource")):
            fail(f"{path.name}: panel {title!r} does not use the data source variable {wanted}")
        targets = panel.get("targets") or []
        if not targets:
            fail(f"{path.name}: panel {title!r} has no query")
        for target in targets:
            if not str(target.get("expr", "")).strip():
                fail(f"{path.name}: panel {title!r} has a query without an expression")
            if "datasource" in target and not uses_variable(target["datasource"]):
                fail(f"{path.name}: a query of panel {title!r} does not use {wanted}")
            count += 1
    print(f"{path.name}: {len(panels)} panels, {count} queries, data source {wanted}")


def github_anchor(heading):
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def check_alerts():
    base = ROOT / "deploy/prometheus"
    anchors = {
        github_anchor(m.group(1))
        for m in re.finditer(r"^#+\s+(.*)$", (ROOT / "docs/operations.md").read_text(), re.M)
    }
    declared = re.findall(
        r"^# runbook_base: (\S+)$", (base / "rules/alerts.yml").read_text(), re.M
    )
    if len(declared) != 1 or not declared[0].startswith("https://"):
        fail("alerts.yml must declare one absolute `# runbook_base: https://...` line")
        declared = [""]
    runbook_base = declared[0]
    alerts = {}
    for path in sorted((base / "rules").glob("*.yml")):
        for group in load_yaml(path)[0]["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    alerts[rule["alert"]] = rule
    fires, quiet = set(), set()
    for path in sorted((base / "tests").glob("*.test.yml")):
        for test in load_yaml(path)[0]["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    for name, rule in sorted(alerts.items()):
        notes = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not notes.get(key):
                fail(f"alert {name} has no {key} annotation")
        runbook = notes.get("runbook_url", "")
        page, _, anchor = runbook.partition("#")
        if page != runbook_base or anchor not in anchors:
            fail(
                f"alert {name}: runbook_url {runbook!r} is not {runbook_base}#<a heading of docs/operations.md>"
            )
        if name not in fires:
            fail(f"alert {name} has no unit test case where it fires")
        if name not in quiet:
            fail(f"alert {name} has no unit test case where it does not fire")
    print(f"{len(alerts)} alerts: each with annotations, a firing and a quiet test, a runbook")


def check_config_generator():
    path = ROOT / "config/kustomization.yaml"
    schema = json.loads((ROOT / "scripts/schemas/kustomization-v1beta1.json").read_text())
    doc = load_yaml(path)[0]
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path)
        fail(f"config/kustomization.yaml: {where}: {e.message}")
    generated = {g.get("name"): g.get("files", []) for g in doc.get("configMapGenerator", [])}
    if generated.get("rollboard-config") != ["rollboard.toml"]:
        fail("config/kustomization.yaml must generate rollboard-config from rollboard.toml")
    else:
        print("config/kustomization.yaml: rollboard-config from config/rollboard.toml")


check_config_generator()
check_kubernetes(ROOT / "deploy/kubernetes")
check_kubernetes(ROOT / "deploy/kubernetes-split")
check_grafana()
check_alerts()
for e in errors:
    print(f"ERROR {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
