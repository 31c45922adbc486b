"""The gpushare device plugin: kubelet's device plugin API for gpushare.io/* (docs/deviceplugin.md).

Modules: ``v1beta1`` the generated kubelet API, ``discovery`` GPUs through NVML, ``health`` Xid
events and the health rule, ``inventory`` the devices each resource advertises, ``matching``
which pod a kubelet request belongs to (pure), ``response`` what a container gets (pure),
``files`` the per-container files on the host, ``kube`` the API server, ``service`` the gRPC
services, ``kubelet`` registration and the plugin's lifecycle.
"""
