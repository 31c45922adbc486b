"""The Binding client (extender/binding.py) against the real API server of the extender cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod, ServiceAccount, ServiceAccountToken
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding

from gpushare.extender.binding import BindingClient, BindingFailed

ANNOTATIONS = {"gpushare.io/phase": "assumed"}


def _unscheduled_pod(ekube: Client, namespace: str, name: str) -> str:
    """A pending pod no scheduler takes (its schedulerName is nobody's); its uid."""
    created = ekube.create(
        Pod.from_dict(
            {
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "schedulerName": "nobody",
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            }
        )
    )
    return created.metadata.uid


def _first_node(extender_cluster) -> str:
    return sorted(extender_cluster.cache.nodes)[0]


def test_binding_sets_the_node_and_the_annotations_in_one_call(
    extender_cluster, ekube: Client, ens: str
) -> None:
    uid = _unscheduled_pod(ekube, ens, "p")
    config = KubeConfig.from_file(extender_cluster.info.kubeconfig).get()
    bindings = BindingClient(config, 2)
    try:
        bindings.bind(ens, "p", uid, _first_node(extender_cluster), ANNOTATIONS)
    finally:
        bindings.close()
    pod = ekube.get(Pod, "p", namespace=ens)
    assert pod.spec.nodeName == _first_node(extender_cluster)
    assert pod.metadata.annotations["gpushare.io/phase"] == "assumed"


def test_a_refused_binding_raises_with_the_api_servers_reason(
    extender_cluster, ekube: Client, ens: str
) -> None:
    config = KubeConfig.from_file(extender_cluster.info.kubeconfig).get()
    bindings = BindingClient(config, 2)
    try:
        with pytest.raises(BindingFailed) as missing:
            bindings.bind(ens, "absent", "uid", _first_node(extender_cluster), ANNOTATIONS)
        assert missing.value.status == 404
        assert 'pods "absent" not found' in str(missing.value)
        uid = _unscheduled_pod(ekube, ens, "p")
        bindings.bind(ens, "p", uid, _first_node(extender_cluster), ANNOTATIONS)
        with pytest.raises(BindingFailed) as twice:  # already bound: a conflict
            bindings.bind(ens, "p", uid, _first_node(extender_cluster), ANNOTATIONS)
        assert twice.value.status == 409
    finally:
        bindings.close()


def test_a_rotated_service_account_token_is_read_again_after_a_401(
    extender_cluster, ekube: Client, ens: str, tmp_path: Path
) -> None:
    # In a cluster the extender authenticates with its service account's token file, which
    # the kubelet rotates: a 401 must make the client read the file again.
    ekube.create(ServiceAccount.from_dict({"metadata": {"name": "binder", "namespace": ens}}))
    ekube.create(
        Role.from_dict(
            {
                "metadata": {"name": "binder", "namespace": ens},
                "rules": [{"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}],
            }
        )
    )
    ekube.create(
        RoleBinding.from_dict(
            {
                "metadata": {"name": "binder", "namespace": ens},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "binder",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "binder", "namespace": ens}],
            }
        )
    )
    token = ekube.create(
        ServiceAccountToken.from_dict(
            {
                "metadata": {"name": "binder", "namespace": ens},
                "spec": {"audiences": [], "expirationSeconds": 3600},
            }
        ),
        "binder",
        namespace=ens,
    ).status.token
    admin = KubeConfig.from_file(extender_cluster.info.kubeconfig).get()
    token_file = tmp_path / "token"
    token_file.write_text("not-a-valid-token")
    config = KubeConfig.from_dict(
        {
            "clusters": [
                {
                    "name": "c",
                    "cluster": {
                        "server": admin.cluster.server,
                        "certificate-authority-data": admin.cluster.certificate_auth_data,
                    },
                }
            ],
            "users": [{"name": "u", "user": {"tokenFile": str(token_file)}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    ).get()
    uid = _unscheduled_pod(ekube, ens, "p")
    bindings = BindingClient(config, 2)
    try:
        with pytest.raises(BindingFailed) as stale:
            bindings.bind(ens, "p", uid, _first_node(extender_cluster), ANNOTATIONS)
        assert stale.value.status == 401
        token_file.write_text(token)  # the kubelet rotated it
        bindings.bind(ens, "p", uid, _first_node(extender_cluster), ANNOTATIONS)
    finally:
        bindings.close()
    assert ekube.get(Pod, "p", namespace=ens).spec.nodeName == _first_node(extender_cluster)
