#!/usr/bin/env python3
"""Validates deploy/k8s: every kustomization renders (kubectl kustomize), every built-in object
passes kubernetes-validate --strict, and the custom resources (KEDA ScaledObject, prometheus-
operator ServiceMonitor and PrometheusRule), which it has no schema for, pass the structural
checks below. Also checks what ties the objects to the worker: the grace period against
SHUTDOWN_TIMEOUT_SECS, the scratch volume, the probes, the security context, and that KEDA
watches the worker's group and topic.

    scripts/validate-k8s.py [BINARY]   (BINARY checks that the mounted worker.toml loads)
"""

import os
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "k8s")
TARGETS = ["base", "overlays/dev", "overlays/prod", "overlays/prod-static", "overlays/prod-scan",
           "overlays/prod-api", "overlays/local-cluster"]
# config/default.toml's limits.max_input_bytes.
MAX_INPUT_BYTES = 8589934592
K8S_VERSION = "1.30.0"
errors = []


def check(ok, target, what):
    if not ok:
        errors.append(f"{target}: {what}")


def render(target):
    out = subprocess.run(
        ["kubectl", "kustomize", os.path.join(ROOT, target)],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        errors.append(f"{target}: kustomize failed: {out.stderr.strip()}")
        return None, []
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


def builtin_schemas(target, text):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(text)
        f.flush()
        out = subprocess.run(
            ["kubernetes-validate", "--strict", "--quiet", "--no-warn", "-k", K8S_VERSION, f.name],
            capture_output=True, text=True, check=False,
        )
    check(out.returncode == 0, target, f"kubernetes-validate: {out.stdout}{out.stderr}")


def env_of(docs):
    env = {}
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("media-worker-env"):
            env.update(d.get("data", {}))
    return env


def worker(target, docs, env, binary):
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    check(len(workloads) == 1, target, f"one workload, found {len(workloads)}")
    if not workloads:
        return None
    w = workloads[0]
    pod = w["spec"]["template"]["spec"]
    c = pod["containers"][0]
    shutdown = 25
    for d in docs:
        if d["kind"] == "ConfigMap" and "worker.toml" in d.get("data", {}):
            toml = d["data"]["worker.toml"]
            for line in toml.splitlines():
                if line.strip().startswith("shutdown_timeout_secs"):
                    shutdown = int(line.split("=")[1])
            if binary:
                with tempfile.NamedTemporaryFile("w", suffix=".toml") as f, \
                        tempfile.NamedTemporaryFile("w") as tokens:
                    f.write(toml)
                    f.flush()
                    # The tokens Secret is mounted in the pod only.
                    mounted = {"API_TOKENS_FILE": tokens.name} if "API_TOKENS_FILE" in env else {}
                    with tempfile.TemporaryDirectory() as out:
                        r = subprocess.run(
                            [binary, "schemas", "--out", out],
                            env={**os.environ, **env, **mounted, "MEDIA_WORKER_CONFIG": f.name},
                            capture_output=True, text=True, check=False,
                        )
                check(r.returncode == 0, target, f"worker.toml does not load: {r.stderr}")
    shutdown = int(env.get("SHUTDOWN_TIMEOUT_SECS", shutdown))
    grace = pod.get("terminationGracePeriodSeconds", 30)
    check(grace >= shutdown + 5, target, f"grace {grace}s < SHUTDOWN_TIMEOUT_SECS {shutdown} + 5")
    sc = c.get("securityContext", {})
    check(sc.get("readOnlyRootFilesystem") is True, target, "root filesystem not read-only")
    check(sc.get("capabilities", {}).get("drop") == ["ALL"], target, "capabilities not dropped")
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, target, "may run as root")
    check(c["readinessProbe"]["httpGet"]["path"] == "/health/ready", target, "readiness probe")
    check(c["livenessProbe"]["httpGet"]["path"] == "/health/live", target, "liveness probe")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    scratch = [v for v in pod["volumes"] if v["name"] == mounts.get("/scratch")]
    check(scratch and scratch[0].get("emptyDir", {}).get("sizeLimit"), target,
          "/scratch is not an emptyDir with a sizeLimit")
    # The kubelet evicts past either; the worker budgets within SCRATCH_BYTES, the limit.
    limit = c.get("resources", {}).get("limits", {}).get("ephemeral-storage")
    check(scratch and limit == scratch[0].get("emptyDir", {}).get("sizeLimit"), target,
          "the container's ephemeral-storage limit is not the scratch volume's sizeLimit")
    refs = {e["name"]: e.get("valueFrom", {}).get("resourceFieldRef", {}).get("resource")
            for e in c.get("env", [])}
    check(refs.get("SCRATCH_BYTES") == "limits.ephemeral-storage", target,
          "SCRATCH_BYTES is not the ephemeral-storage limit (downward API)")
    check(pod.get("topologySpreadConstraints"), target, "no topologySpreadConstraints")
    res = c.get("resources", {})
    check(res.get("requests") and res.get("limits"), target, "requests and limits")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if env.get("KAFKA_INTAKE") == "false":
        # The sync API: its port served, authenticated off loopback, no Kafka-lag scaling.
        api_port = int(env.get("API_ADDR", ":0").rsplit(":", 1)[1])
        check(ports.get("api") == api_port, target, f"API_ADDR port {api_port} is not the api port")
        check(env.get("API_TOKENS_FILE", "").startswith(tuple(
            m["mountPath"] for m in c.get("volumeMounts", []))), target, "API tokens not mounted")
        check(not any(d["kind"] == "ScaledObject" for d in docs), target,
              "an API-only workload is scaled on Kafka lag")
        check(any(p.get("targetPort") == "api" for d in docs if d["kind"] == "Service"
                  for p in d["spec"]["ports"]), target, "no Service exposes the API")
    if env.get("CLAMD_ADDR"):
        # clamd on loopback, as a native sidecar that starts (signatures loaded) first.
        port = int(env["CLAMD_ADDR"].rsplit(":", 1)[1])
        sidecars = [s for s in pod.get("initContainers", []) if s.get("restartPolicy") == "Always"]
        clamd = [s for s in sidecars if any(p["containerPort"] == port for p in s.get("ports", []))]
        check(env["CLAMD_ADDR"].startswith("tcp://127.0.0.1:") and clamd, target,
              "CLAMD_ADDR is not a clamd sidecar on loopback")
        check(clamd and clamd[0].get("startupProbe") and clamd[0].get("readinessProbe"), target,
              "the clamd sidecar lacks a startup or readiness probe")
        check(clamd and clamd[0].get("resources", {}).get("limits", {}).get("memory"), target,
              "the clamd sidecar has no memory limit")
        # clamd refuses a longer stream ("INSTREAM size limit exceeded"): an input the worker
        # takes but clamd cannot scan is answered scan_unavailable (retryable) forever.
        conf = next((d["data"]["clamd.conf"] for d in docs if d["kind"] == "ConfigMap"
                     and "clamd.conf" in d.get("data", {})), "")
        stream = next((size_bytes(line.split()[1]) for line in conf.splitlines()
                       if line.startswith("StreamMaxLength")), 0)
        max_input = int(env.get("MAX_INPUT_BYTES", MAX_INPUT_BYTES))
        check(max_input <= stream, target,
              f"MAX_INPUT_BYTES {max_input} > clamd's StreamMaxLength {stream}")
    # Every overlay a cluster pulls from names a registry (the base's `media-worker:latest` is
    # in none); the local cluster's images are imported, never pulled.
    if target.startswith("overlays/") and target != "overlays/local-cluster":
        check("/" in c["image"], target, f"image {c['image']} names no registry")
    if w["kind"] == "StatefulSet":
        names = [e["name"] for e in c.get("env", [])]
        check("KAFKA_GROUP_INSTANCE_ID" in names, target, "static membership needs KAFKA_GROUP_INSTANCE_ID")
    return w


def size_bytes(text):
    """clamd.conf's sizes: a number with K or M (binary) or none."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def custom_resources(target, docs, env, workload):
    for pdb in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        check(pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow", target,
              "the PodDisruptionBudget blocks drains while the pods are unready "
              "(unhealthyPodEvictionPolicy is not AlwaysAllow)")
    # Egress on 443 (S3) reaches no private or link-local address: the API server answers on
    # 443 there on many clusters, the metadata endpoint on 169.254.169.254.
    for pol in (d for d in docs if d["kind"] == "NetworkPolicy"):
        for rule in pol["spec"].get("egress", []):
            if not any(p.get("port") == 443 for p in rule.get("ports", [])):
                continue
            blocks = [t.get("ipBlock") for t in rule.get("to", [])]
            private = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]
            check(blocks and all(b and set(private) <= set(b.get("except", [])) for b in blocks),
                  target, "egress on 443 reaches private addresses (the API server)")
    services = [d for d in docs if d["kind"] == "Service"]
    for d in docs:
        kind, spec = d["kind"], d.get("spec", {})
        if kind == "ScaledObject":
            ref = spec.get("scaleTargetRef", {})
            check(workload is not None and ref.get("name") == workload["metadata"]["name"]
                  and ref.get("kind", "Deployment") == workload["kind"], target,
                  f"ScaledObject targets {ref}")
            # KEDA owns the replica count: an applied `replicas` would reset it.
            check(workload is None or "replicas" not in workload.get("spec", {}), target,
                  "the workload sets replicas although a ScaledObject manages them")
            lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
            check(1 <= lo <= hi, target, f"replicas {lo}..{hi}")
            # Scale-in one pod at a time: each drains its jobs and rebalances the group.
            down = (spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
                    .get("behavior", {}).get("scaleDown", {}))
            check(down.get("policies") and all(p["type"] == "Pods" and p["value"] == 1
                                               for p in down["policies"])
                  and down.get("stabilizationWindowSeconds", 0) >= 60, target,
                  "scale-in is not one pod at a time after a stabilization window")
            triggers = spec.get("triggers", [])
            kafkas = [t.get("metadata", {}) for t in triggers if t["type"] == "kafka"]
            proms = [t.get("metadata", {}) for t in triggers if t["type"] == "prometheus"]
            prom = proms[0] if proms else None
            check(kafkas and prom is not None, target, "kafka and prometheus triggers")
            # The request group on the request topic, and, with a unit topic, the unit topic's
            # own group on it (the worker's default: the request group's id + ".units").
            watched = {(k.get("consumerGroup"), k.get("topic")) for k in kafkas}
            wanted = {(env.get("KAFKA_GROUP_ID"), env.get("KAFKA_REQUEST_TOPIC"))}
            if env.get("KAFKA_UNIT_TOPIC"):
                unit_group = env.get("KAFKA_UNIT_GROUP_ID") or f'{env.get("KAFKA_GROUP_ID")}.units'
                wanted.add((unit_group, env["KAFKA_UNIT_TOPIC"]))
            check(watched == wanted, target,
                  f"KEDA watches {sorted(watched)}, the worker consumes {sorted(wanted)}")
            for kafka in kafkas:
                for k in ("bootstrapServers", "consumerGroup", "topic", "lagThreshold"):
                    check(k in kafka, target, f"kafka trigger lacks {k}")
                # A partition behind one long job keeps its offset for minutes: its work counts.
                check(kafka.get("excludePersistentLag") == "false", target,
                      "excludePersistentLag hides the work behind a long job")
                check(kafka.get("bootstrapServers") == env.get("KAFKA_BOOTSTRAP_SERVERS"), target,
                      "KEDA and the worker use different brokers")
                reset = env.get("KAFKA_PROPERTY_AUTO_OFFSET_RESET", "earliest")
                check(kafka.get("offsetResetPolicy") == reset, target,
                      f"KEDA's offsetResetPolicy is not the consumer's auto.offset.reset ({reset})")
            auth = [t.get("authenticationRef", {}).get("name") for t in triggers if t["type"] == "kafka"]
            check(len(set(auth)) == 1, target, f"the kafka triggers authenticate alike: {auth}")
            for name in filter(None, auth):
                check(any(d["kind"] == "TriggerAuthentication" and d["metadata"]["name"] == name
                          for d in docs), target, f"TriggerAuthentication {name} missing")
            if prom:
                for k in ("serverAddress", "query", "threshold"):
                    check(k in prom, target, f"prometheus trigger lacks {k}")
                check("media_worker_backlog_seconds" in prom.get("query", ""), target,
                      "prometheus trigger does not use the backlog")
                ns = d["metadata"].get("namespace", "default")
                check(f'namespace="{ns}"' in prom.get("query", ""), target,
                      f"prometheus trigger is not scoped to its namespace {ns}")
        elif kind == "ServiceMonitor":
            sel = spec.get("selector", {}).get("matchLabels", {})
            match = [s for s in services
                     if sel and all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
            check(match, target, "ServiceMonitor selects no Service")
            ports = {p.get("name") for s in match for p in s["spec"].get("ports", [])}
            for e in spec.get("endpoints", []):
                check(e.get("port") in ports and e.get("path") == "/metrics", target,
                      f"ServiceMonitor endpoint {e}")
        elif kind == "PrometheusRule":
            rules = [r for g in spec.get("groups", []) for r in g.get("rules", [])]
            check(rules, target, "PrometheusRule has no rules")
            runbook = open(os.path.join(ROOT, "..", "..", "docs", "operations.md")).read()
            anchors = {line[4:].strip().lower() for line in runbook.splitlines()
                       if line.startswith("### ")}
            for r in rules:
                check(r.get("alert") and r.get("expr") and r.get("labels", {}).get("severity"),
                      target, f"rule {r.get('alert')} lacks alert/expr/severity")
                notes = r.get("annotations", {})
                check(all(notes.get(k) for k in ("summary", "description", "runbook_url")),
                      target, f"rule {r.get('alert')} lacks summary/description/runbook_url")
                anchor = notes.get("runbook_url", "").rsplit("#", 1)[-1]
                check(anchor == r.get("alert", "").lower() and anchor in anchors, target,
                      f"rule {r.get('alert')}: runbook anchor #{anchor} not in docs/operations.md")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else None
    for target in TARGETS:
        text, docs = render(target)
        if text is None:
            continue
        builtin_schemas(target, text)
        env = env_of(docs)
        workload = worker(target, docs, env, binary)
        custom_resources(target, docs, env, workload)
        kinds = sorted({d["kind"] for d in docs})
        print(f"{target}: {len(docs)} objects ({', '.join(kinds)})")
    if errors:
        print("\n".join(errors))
        sys.exit(1)
    print("deploy/k8s: all kustomizations render and validate")


if __name__ == "__main__":
    main()
