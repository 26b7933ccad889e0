"""Prefill/decode discovery: where engines announce themselves so a router can pair them.

``etcd`` is a small client for etcd's v3 HTTP JSON gateway (no gRPC or protobuf), ``record`` the
key layout and the worker record a router reads, ``registrar`` the thread that keeps one worker
registered under a lease. None of these import vLLM; ``infera.engine.vllm.api.discovery`` joins them to
the engine entry point. See ``docs/pd.md``.
"""
